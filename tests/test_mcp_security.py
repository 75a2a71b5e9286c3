"""The agent surface as an attack surface (issue 38), at the level of the tools' workspace (tracediag/agent/tools.py)
that the MCP server calls: no byte of a file that is not the format asked for reaches an answer; paths outside the
allowed roots (and links out of them) are refused, naming the path and the roots, and nothing is written there;
concurrent calls get their own run folders and their own answers; answers are bounded; arguments are validated
like the CLI's; a cancelled query stops."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import SAMPLES

from tracediag.agent.cancel import Cancel, Cancelled
from tracediag.agent.readonly_sql import MAX_BYTES
from tracediag.agent.roots import Access
from tracediag.agent.tools import Workspace
from tracediag.errors import InputError, TracediagError, UsageError

HEALTHY = SAMPLES / "healthy_tp2"
MATH = SAMPLES / "math_decode_tp2"
SECRET = "sk-live-7f3b9c0d1e2a4b5c6d7e8f9a0b1c2d3e"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("runs"))
    return ws, ws.analyze([str(HEALTHY)], model=str(HEALTHY / "config.json"))["run"]


@pytest.mark.parametrize("arg", ["log", "metrics", "bench"])
def test_a_secret_in_a_file_that_is_not_the_format_never_reaches_the_answer(tmp_path, arg):
    env = tmp_path / ".env"
    env.write_text(f"OPENAI_API_KEY={SECRET}\nDB_PASSWORD=hunter2\n")
    ws = Workspace(tmp_path / "runs")
    with pytest.raises(TracediagError) as e:
        ws.analyze([str(HEALTHY)], **{arg: str(env)})
    text = str(e.value)
    assert SECRET not in text and "hunter2" not in text and "OPENAI" not in text, text
    assert ".env" in text  # the file is named, with what it looks like


def test_paths_outside_the_roots_are_refused_and_nothing_is_written(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.log").write_text(SECRET)
    (root / "link").symlink_to(outside)
    access = Access.of([], [root], runs_dir=root / "runs", base=root)
    ws = Workspace(root / "runs").scoped(access, None)
    for value in (
        str(outside / "secret.log"),
        str(root / "link" / "secret.log"),
        "../outside/secret.log",
        "/proc/self/environ",
    ):
        with pytest.raises(UsageError, match="outside the allowed roots") as e:
            ws.analyze([str(HEALTHY)], log=value)
        assert str(root) in str(e.value) and SECRET not in str(e.value)
    with pytest.raises(UsageError, match="outside the allowed roots"):
        ws.analyze([str(HEALTHY)], out=str(outside / "run"))
    assert not (outside / "run").exists()


def test_concurrent_calls_get_their_own_folders_and_their_own_answers(tmp_path):
    ws = Workspace(tmp_path / "runs")
    inputs = [HEALTHY, MATH, HEALTHY, MATH]
    solo = {p: Workspace(tmp_path / f"solo-{p.name}").analyze([str(p)])["verdict"]["headline"] for p in (HEALTHY, MATH)}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: ws.analyze([str(p)]), inputs))
    assert len({a["run"] for a in answers}) == 4  # run-1 … run-4, each reserved before the work
    for p, a in zip(inputs, answers, strict=True):
        assert a["verdict"]["headline"] == solo[p]
        doc = json.loads((tmp_path / "runs" / a["run"].rsplit("/", 1)[-1] / "findings.json").read_text())
        assert doc["verdict"]["headline"] == solo[p]


def test_a_huge_query_answer_is_cut_at_the_byte_cap_and_says_so(run):
    ws, folder = run
    res = ws.query(folder, "SELECT repeat('x', 5000) AS s FROM range(10000)", max_rows=10_000)
    assert res["truncated"] and res["truncated_by"] == "max_bytes" and res["row_count"] < 10_000
    assert len(json.dumps(res["rows"])) <= MAX_BYTES


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ws, run: ws.analyze([str(HEALTHY)], tp=1e30), "tp must be an integer"),
        (lambda ws, run: ws.analyze([str(HEALTHY)], tp=99999), "tp must be from 1 to 4,096"),
        (lambda ws, run: ws.query(run, "SELECT 1", max_rows=0), "max_rows must be from 1"),
        (lambda ws, run: ws.analyze(["a\x00b"]), "inputs[0]: the path holds a NUL byte"),
        (lambda ws, run: ws.analyze(["x" * 100_000]), "inputs[0]: a path of 100,000 characters"),
    ],
)
def test_arguments_are_validated_with_one_line_errors(run, call, message):
    ws, folder = run
    with pytest.raises((UsageError, InputError)) as e:
        call(ws, folder)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_cancelled_query_stops_at_once(run):
    ws, folder = run
    cancel = Cancel()
    scoped = ws.scoped(None, cancel)
    threading.Timer(0.5, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        scoped.query(folder, "SELECT count(*) FROM range(10000000000) a, range(1000) b", time_limit_s=60)
    assert time.monotonic() - t0 < 10  # the interrupt, not the 60 s time limit


def test_the_server_refuses_paths_outside_its_roots(tmp_path):
    """Driven with the official SDK client over stdio: `--allow-root` bounds every path argument; a refusal is a tool
    error naming the path and the roots, and the file's content never appears."""
    import asyncio
    import os
    import sys

    from conftest import REPO
    from mcp import Client, StdioServerParameters

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keys.env").write_text(f"KEY={SECRET}\n")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tracediag", "mcp", "--runs-dir", str(root / "runs"), "--allow-root", str(root)],
        env=env,
        cwd=str(root),
    )

    async def session():
        async with Client(params, read_timeout_seconds=120) as c:
            return [
                await c.call_tool("analyze", {"inputs": [str(outside / "keys.env")]}),
                await c.call_tool("analyze", {"inputs": [str(HEALTHY)]}),  # the sample is outside these roots too
                await c.call_tool("query", {"run": str(outside), "sql": "SELECT 1"}),
            ]

    for r in asyncio.run(session()):
        text = r.content[0].text
        assert r.is_error and "outside the allowed roots" in text and str(root) in text, text
        assert SECRET not in text
