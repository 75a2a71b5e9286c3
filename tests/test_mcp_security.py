"""The agent surface as an attack surface (issue 38): no byte of a file that is not the format asked for reaches an
answer; paths outside the allowed roots (and links out of them) are refused, naming the path and the roots, and
nothing is written there; concurrent calls get their own run folders and their own answers; answers are bounded;
arguments are validated like the CLI's; a cancelled query stops; the server exits when its stdin closes.

First at the level of the tools' workspace (tracediag/agent/tools.py), then through `tracediag mcp` driven by the
official SDK client over stdio (one server session for most of them, each test reading what it did), and the
CLI's own errors about a file that is not the format asked for."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO, SAMPLES
from mcp import Client, StdioServerParameters, types

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


def _forged_copy(folder, tmp_path, code: str):
    """A copy of the run folder whose trace.duckdb also runs `code` (`{secret}`: a file holding SECRET)."""
    import duckdb

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    forged = tmp_path / "forged"
    shutil.copytree(folder, forged)
    con = duckdb.connect(str(forged / "trace.duckdb"))
    con.execute(code.format(secret=secret))
    con.close()
    return forged


@pytest.mark.parametrize(
    "code",
    [
        "DROP TABLE kernels; CREATE VIEW kernels AS SELECT * FROM read_text('{secret}')",
        "CREATE MACRO median(a) AS 42",
        "CREATE VIEW everything AS SELECT * FROM range(1000000000000)",
        "CREATE OR REPLACE VIEW step_collectives AS SELECT content AS op FROM read_text('{secret}')",
        "CREATE TABLE forged (n BIGINT, s VARCHAR GENERATED ALWAYS AS (repeat('x', n)))",
    ],
)
def test_a_read_back_store_that_carries_code_is_refused_by_diff_and_check(run, tmp_path, code):
    """A baseline or diff input is data: a view over a local file, a macro that shadows a built-in, a view that never
    ends, a generated column — 'not a tracediag store', and the file's content nowhere."""
    ws, folder = run
    forged = _forged_copy(folder, tmp_path, code)
    for call in (
        lambda: ws.diff(str(forged), folder, force_compare=True),
        lambda: ws.check([str(HEALTHY)], model=str(HEALTHY / "config.json"), baseline=str(forged)),
    ):
        with pytest.raises(InputError, match="not a tracediag store") as e:
            call()
        assert str(forged / "trace.duckdb") in str(e.value) and SECRET not in str(e.value)


def test_a_read_back_store_of_our_own_is_read(run):
    ws, folder = run
    d = ws.diff(folder, folder)
    assert d["comparability"]["comparable"] and SECRET not in json.dumps(d)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ws, run: ws.analyze([str(HEALTHY)], tp=1e30), "tp: must be an integer"),
        (lambda ws, run: ws.analyze([str(HEALTHY)], tp=99999), "tp: must be an integer from 1 to 4096"),
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


@pytest.mark.parametrize("stage", ["running", "building"])
def test_a_cancelled_analysis_stops_inside_the_stage_it_is_in(tmp_path, monkeypatch, stage):
    """Cancelled while a stage runs (the rules, the report sections), the analysis stops at that stage's next
    checkpoint — one rule or section later — not at the next stage: the stage's last rule or section never runs,
    and the reserved run folder goes."""
    import importlib

    from tracediag.reports.sections import SECTION_BUILDERS
    from tracediag.rules import RULE_MODULES

    last = importlib.import_module(RULE_MODULES[-1] if stage == "running" else list(SECTION_BUILDERS)[-1])
    attr = "check" if stage == "running" else "build"
    reached = []
    monkeypatch.setattr(last, attr, lambda ctx: reached.append(ctx))
    cancel = Cancel()
    ws = Workspace(tmp_path / "runs").scoped(None, cancel)

    def progress(name: str) -> None:
        if name.startswith(stage):
            cancel.set()  # after the stage's own boundary check: only a checkpoint inside the stage sees it

    with pytest.raises(Cancelled):
        ws.analyze([str(HEALTHY)], progress=progress)
    assert reached == []
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_stop_interrupts_the_running_duckdb_statement():
    import duckdb

    from tracediag.interrupt import interrupting, stopping

    flag, con = Cancel(), duckdb.connect()
    threading.Timer(0.3, flag.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled), stopping(flag), interrupting(con):
        con.execute(SPIN).fetchall()
    assert time.monotonic() - t0 < 5


# --- through the server, driven by the SDK client over stdio -------------------------------------------------

HUGE = "SELECT repeat('x', 5000) AS s FROM range(10000)"
SPIN = "SELECT count(*) FROM range(10000000000) a, range(1000) b"  # minutes of CPU, unless interrupted


def _env() -> dict[str, str]:
    # the checkout under test first (the client passes only a safe subset of the environment on)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def _server(runs: Path, cwd: Path, *roots: Path) -> StdioServerParameters:
    allow = [a for r in roots for a in ("--allow-root", str(r))]
    return StdioServerParameters(command=sys.executable, args=["-m", "tracediag", "mcp", "--runs-dir", str(runs),
                                 *allow], env=_env(), cwd=str(cwd))  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_pid() -> int:
    """The pid of the `tracediag mcp` child of this process (the SDK client starts it directly)."""
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == me and b"tracediag\x00mcp" in cmd:
                return int(d.name)
    raise AssertionError("no tracediag mcp child")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, Any]:
    """One server session with `--allow-root root`, started in `root`, and a second one whose client offers roots of
    its own; every answer kept (`texts`: all the text that came back)."""
    tmp = tmp_path_factory.mktemp("served")
    root, outside, other = tmp / "root", tmp / "outside", tmp / "other"
    for d in (root, outside, other):
        d.mkdir()
    for sample in (HEALTHY, MATH):
        shutil.copytree(sample, root / sample.name)
    shutil.copytree(HEALTHY, other / HEALTHY.name)
    (root / ".env").write_text(f"OPENAI_API_KEY={SECRET}\nDB_PASSWORD=hunter2\n")
    (outside / "keys.env").write_text(f"KEY={SECRET}\n")
    (root / "link").symlink_to(outside)
    (root / "traces").mkdir()
    (root / "traces" / "rank0.json").symlink_to(outside / "keys.env")  # a folder argument holding a link out
    got: dict[str, Any] = {"root": root, "outside": outside, "other": other, "texts": []}
    tp1, math = str(root / HEALTHY.name), str(root / MATH.name)

    async def session() -> None:
        async with Client(_server(root / "runs", root, root), read_timeout_seconds=120) as c:

            async def call(name: str, args: dict[str, Any]) -> types.CallToolResult:
                r = await c.call_tool(name, args)
                got["texts"] += [x.text for x in r.content if isinstance(x, types.TextContent)]
                return r

            got["secret"] = {
                (tool, arg): await call(tool, {"inputs": [tp1], arg: ".env"})
                for tool in ("analyze", "check")
                for arg in ("log", "metrics", "bench")
            }
            got["refused"] = {
                value: await call("analyze", {"inputs": [tp1], "log": value})
                for value in (str(outside / "keys.env"), "link/keys.env", "../outside/keys.env", "/proc/self/environ")
            }
            got["refused_input"] = await call("analyze", {"inputs": [str(HEALTHY)]})  # the sample: outside the roots
            got["refused_folder"] = await call("analyze", {"inputs": [str(root / "traces")]})
            got["refused_run"] = await call("query", {"run": str(outside), "sql": "SELECT 1"})
            got["refused_out"] = await call("analyze", {"inputs": [tp1], "out": str(outside / "run")})
            got["refused_out_link"] = await call("analyze", {"inputs": [tp1], "out": "link/run"})
            got["solo"] = {p: await call("analyze", {"inputs": [p]}) for p in (tp1, math)}
            together = [tp1, math, tp1, math]
            answers = await asyncio.gather(*(call("analyze", {"inputs": [p]}) for p in together))
            got["together"] = list(zip(together, answers, strict=True))
            run = got["solo"][tp1].structured_content["run"]
            got["huge"] = await call("query", {"run": run, "sql": HUGE, "max_rows": 10_000})
            got["tp_huge"] = await call("analyze", {"inputs": [tp1], "tp": 1e30})
            got["tp_big"] = await call("analyze", {"inputs": [tp1], "tp": 99999})
            got["tp_string"] = await call("analyze", {"inputs": [tp1], "tp": "a" * 10_000})
            got["inputs_not_list"] = await call("analyze", {"inputs": {"a": 1}})
            got["rows_0"] = await call("query", {"run": run, "sql": "SELECT 1", "max_rows": 0})
            got["nul"] = await call("analyze", {"inputs": ["a\x00b"]})
            got["nul_log"] = await call("analyze", {"inputs": [tp1], "log": "x\x00.log"})
            got["long"] = await call("analyze", {"inputs": ["x" * 100_000]})
            pid = _server_pid()
            t0 = time.monotonic()
            with anyio.move_on_after(1.0):  # the client gives up: the SDK sends notifications/cancelled
                await c.call_tool("query", {"run": run, "sql": SPIN, "time_limit_s": 60})
            got["cancel_after_s"] = time.monotonic() - t0
            await anyio.sleep(0.3)
            cpu0 = _cpu_seconds(pid)
            await anyio.sleep(1.0)
            got["cpu_after_cancel"] = _cpu_seconds(pid) - cpu0
            got["alive"] = await call("query", {"run": run, "sql": "SELECT 42 AS n"})
            runs_before = sorted(p.name for p in (root / "runs").iterdir())
            with anyio.CancelScope() as scope:

                async def cancel_once_it_derives(progress: float, total: float | None, stage: str | None) -> None:
                    if stage and stage.startswith("deriving"):
                        scope.cancel()  # mid-analysis: after reading, before the rules

                await c.call_tool("analyze", {"inputs": [math]}, progress_callback=cancel_once_it_derives)
            got["analyze_cancelled"] = scope.cancelled_caught
            t0 = time.monotonic()  # the client does not wait for the server's clean-up: poll for it
            while sorted(p.name for p in (root / "runs").iterdir()) != runs_before and time.monotonic() - t0 < 5:
                await anyio.sleep(0.05)
            got["cleanup_s"] = time.monotonic() - t0
            got["runs_before_cancel"] = runs_before
            got["runs_after_cancel"] = {p.name: sorted(x.name for x in p.iterdir()) for p in (root / "runs").iterdir()}
        got["files_outside"] = sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))

        async def client_roots(_ctx: Any) -> types.ListRootsResult:
            return types.ListRootsResult(roots=[types.Root(uri=other.as_uri(), name="other")])

        # the client's roots win over --allow-root
        async with Client(_server(tmp / "runs2", root, root), list_roots_callback=client_roots,
                          read_timeout_seconds=120) as c:  # fmt: skip
            got["client_in"] = await c.call_tool("analyze", {"inputs": [str(other / HEALTHY.name)]})
            got["client_out"] = await c.call_tool("analyze", {"inputs": [tp1]})

    asyncio.run(session())
    return got


def _error_line(r: types.CallToolResult) -> str:
    assert r.is_error, r.structured_content
    text = r.content[0].text
    assert text.startswith("tracediag: error: ") and "\n" not in text, text
    return text


def test_a_secret_in_a_file_that_is_not_a_log_never_reaches_any_answer(served):
    for (tool, arg), r in served["secret"].items():
        text = _error_line(r)
        assert ".env" in text, (tool, arg, text)  # the file is named, with what it looks like
    everything = "\n".join(served["texts"])
    for secret in (SECRET, "hunter2", "OPENAI_API_KEY", "KEY="):
        assert secret not in everything


def test_paths_outside_the_roots_links_out_and_dotdot_are_refused_naming_the_path_and_the_roots(served):
    root = str(served["root"])
    for value, r in served["refused"].items():
        text = _error_line(r)
        assert text.startswith("tracediag: error: log: ") and "outside the allowed roots" in text, text
        assert value in text and root in text and "--allow-root" in text, text
    for key in ("refused_input", "refused_run"):
        text = _error_line(served[key])
        assert "outside the allowed roots" in text and root in text, text
    text = _error_line(served["refused_folder"])
    assert "rank0.json, a link to" in text and "outside the allowed roots" in text, text


def test_out_outside_the_roots_is_refused_and_nothing_is_created_there(served):
    for key in ("refused_out", "refused_out_link"):
        text = _error_line(served[key])
        assert text.startswith("tracediag: error: out: ") and "outside the allowed roots" in text, text
    assert served["files_outside"] == ["keys.env"]


def test_concurrent_analyze_calls_each_get_their_own_folder_and_the_solo_headline(served):
    solo = {p: r.structured_content for p, r in served["solo"].items()}
    assert len({s["verdict"]["headline"] for s in solo.values()}) == 2  # the two inputs tell apart
    runs = [r.structured_content["run"] for _, r in served["together"]]
    assert len(set(runs) | {s["run"] for s in solo.values()}) == 6
    for p, r in served["together"]:
        s = r.structured_content
        assert not r.is_error and s["verdict"] == solo[p]["verdict"] and s["findings"] == solo[p]["findings"]
        doc = json.loads((Path(s["run"]) / "findings.json").read_text())
        assert doc["verdict"]["headline"] == solo[p]["verdict"]["headline"]


def test_a_huge_query_answer_comes_back_cut_at_the_byte_cap_and_says_so(served):
    r = served["huge"]
    s = r.structured_content
    assert not r.is_error and s["truncated"] and s["truncated_by"] == "max_bytes" and s["max_bytes"] == MAX_BYTES
    assert 0 < s["row_count"] == len(s["rows"]) < 10_000
    assert len(json.dumps(s["rows"])) <= MAX_BYTES
    assert len(r.content[0].text) < 1.25 * MAX_BYTES and json.loads(r.content[0].text) == s


def test_out_of_range_numbers_nul_bytes_and_long_paths_are_one_line_errors_naming_the_argument(served):
    assert _error_line(served["tp_huge"]).startswith("tracediag: error: tp: ")  # the schema's integer, one line
    text = _error_line(served["tp_string"])
    assert text.startswith("tracediag: error: tp: Input should be a valid integer") and "aaa" not in text, text
    assert _error_line(served["inputs_not_list"]).startswith("tracediag: error: inputs: ")
    assert "tp: must be an integer from 1 to 4096, got int 99999" in _error_line(served["tp_big"])
    assert "max_rows must be" in _error_line(served["rows_0"])
    assert "inputs[0]: the path holds a NUL byte" in _error_line(served["nul"])
    assert "log: the path holds a NUL byte" in _error_line(served["nul_log"])
    assert "inputs[0]: a path of 100,000 characters" in _error_line(served["long"])


def test_a_cancelled_call_stops_its_query_and_the_server_goes_on(served):
    assert served["cancel_after_s"] < 5
    assert served["cpu_after_cancel"] < 0.2  # idle: the query was interrupted, not left to its 60 s limit
    assert served["alive"].structured_content["rows"] == [[42]]


def test_a_cancelled_analysis_leaves_no_run_folder_and_no_staged_files(served):
    assert served["analyze_cancelled"]
    assert sorted(served["runs_after_cancel"]) == served["runs_before_cancel"], served["runs_after_cancel"]
    assert served["cleanup_s"] < 3


def test_the_clients_roots_replace_the_servers(served):
    assert not served["client_in"].is_error, served["client_in"].content[0].text
    text = _error_line(served["client_out"])
    assert "outside the allowed roots" in text and str(served["other"]) in text and "client's roots" in text, text


def _start_query(proc: subprocess.Popen, run: str) -> None:
    """Speak JSON-RPC to the server on its pipes (a 2025-06-18 client) and leave a long query running."""

    def send(msg: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
          "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}})  # fmt: skip
    assert b'"id":1' in proc.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "query", "arguments": {"run": run, "sql": SPIN, "time_limit_s": 60}}})  # fmt: skip
    time.sleep(1.0)
    assert proc.poll() is None


def test_the_server_exits_when_its_stdin_closes_even_mid_query(served):
    """The client dies mid-call: its end of the pipe closes, and the server stops its query and exits."""
    root = served["root"]
    run = served["solo"][str(root / HEALTHY.name)].structured_content["run"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracediag", "mcp", "--runs-dir", str(root / "runs")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ | _env(), cwd=str(root),
    )  # fmt: skip
    try:
        _start_query(proc, run)
        t0 = time.monotonic()
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


STUBBORN = """
import runpy, sys, time
from tracediag.agent import tools

def query(self, *args, **kwargs):  # a stage that never looks at its cancellation flag
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        pass

tools.Workspace.query = query
sys.argv = ["tracediag", *sys.argv[1:]]
runpy.run_module("tracediag", run_name="__main__")
"""


def test_the_server_is_no_orphan_even_when_the_work_ignores_its_cancellation(tmp_path):
    """Work that never stops by itself (its worker thread would keep the process alive) does not outlive the client
    by more than the grace the server gives it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN, "mcp", "--runs-dir", str(tmp_path / "runs")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ | _env(), cwd=str(tmp_path),
    )  # fmt: skip
    try:
        _start_query(proc, str(tmp_path))
        t0 = time.monotonic()
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - t0 < 8  # the handler's grace and a second, not the work's 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- the CLI: an input that is not the format asked for is described, never quoted -------------------------


@pytest.mark.parametrize("flag", ["--log", "--metrics", "--bench"])
def test_the_cli_names_a_file_that_is_not_the_format_without_its_content(tmp_path, flag):
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    r = subprocess.run([sys.executable, "-m", "tracediag", "analyze", flag, str(passwd), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=os.environ | _env(), timeout=120)  # fmt: skip
    err = r.stderr.strip()
    assert r.returncode == 2 and err.startswith("tracediag: error: ") and "\n" not in err, r.stderr
    assert str(passwd) in err
    for content in ("root:x", "/bin/bash", "daemon", "nologin"):
        assert content not in err and content not in r.stdout


def test_unrecognised_describes_the_shape_of_a_line_never_the_line():
    from tracediag.ingest.unrecognised import file_text, line_shape, not_a_record

    assert line_shape("root:*:20228:0:99999:7:::") == "25 characters, no timestamp"
    assert line_shape("2025-06-26 07:25:31 hello") == "25 characters, with a timestamp"
    assert line_shape("\x00\x01binary") == "8 characters, not text (control or undecodable bytes), no timestamp"
    assert line_shape("y" * 500, cap=120) == "120+ characters, no timestamp"
    described = "line 1 is not a vLLM record: 44 characters, no timestamp"
    assert not_a_record("a vLLM record", 1, f"KEY={SECRET}") == described
    assert file_text("/no/such/file", 3) == "3 lines"
    assert file_text("/proc/self/environ") == ""  # a size of 0 is the kernel's, not the file's


@pytest.mark.parametrize(
    "code",
    [
        "DROP TABLE kernels; CREATE VIEW kernels AS SELECT * FROM read_text('{secret}')",
        "CREATE MACRO median(a) AS 42",
    ],
)
def test_a_store_that_carries_code_is_refused_by_query_and_the_notebook(run, tmp_path, code):
    """The agent's query and tracediag.open read a store as data too: a view over a local file or a macro that
    forges answers is 'not a tracediag store', the file's content nowhere."""
    import tracediag

    ws, folder = run
    forged = _forged_copy(folder, tmp_path, code)
    with pytest.raises(InputError, match="not a tracediag store") as e:
        ws.query(str(forged), "SELECT median(dur_ns) FROM kernels")
    assert SECRET not in str(e.value)
    with tracediag.open(forged) as opened, pytest.raises(InputError, match="not a tracediag store"):
        opened.sql("SELECT 1")
    assert ws.query(folder, "SELECT count(*) AS n FROM steps")["rows"][0][0] > 0  # our own store is read


def test_the_runs_folder_keeps_the_last_runs_and_says_so(tmp_path):
    """Beyond --keep-runs the oldest finished runs go (an agent's loop must not fill the disk); a run still being
    written (no findings.json yet) and the new one stay; the run summary says how many are kept."""
    from tracediag.agent.tools import KEEP_RUNS
    from tracediag.cli.mcp import mcp

    ws = Workspace(tmp_path / "runs", keep_runs=2)
    for n in (1, 2, 3):
        (tmp_path / "runs" / f"run-{n}").mkdir(parents=True)
    for n in (2, 3):
        (tmp_path / "runs" / f"run-{n}" / "findings.json").write_text("{}")
    new = ws._new_run_dir()
    assert new.name == "run-4"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run-1", "run-4"]  # run-1 still being written
    assert "keeps the last 2 runs (--keep-runs)" in ws.kept(new)["kept_note"]
    assert inspect.signature(mcp).parameters["keep_runs"].default == KEEP_RUNS


def test_a_fifo_a_device_and_a_link_out_as_inputs_are_one_line_errors_within_seconds(tmp_path):
    """A named pipe given as a trace, a log, metrics, a bench result, a model config, a baseline or a run; /dev/zero
    (a root of its own here, so that the reading code, not the roots, meets it) as a log, metrics and a trace; a link
    out of the roots as a model config: each answered with one error line naming the path, within a few seconds (a
    read of the pipe would wait for a writer for ever, one of /dev/zero would never end), no byte echoed."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    shutil.copytree(HEALTHY, root / HEALTHY.name)
    tp = str(root / HEALTHY.name)
    fifo = root / "pipe.json"
    os.mkfifo(fifo)
    (outside / "config.json").write_text(json.dumps({"secret": SECRET}))
    (root / "config.json").symlink_to(outside / "config.json")
    calls = [("analyze", {"inputs": [str(fifo)]})]
    calls += [("analyze", {"inputs": [tp], arg: str(fifo)}) for arg in ("log", "metrics", "bench", "model")]
    calls += [("analyze", {"inputs": ["/dev/zero"]})]
    calls += [("analyze", {"inputs": [tp], arg: "/dev/zero"}) for arg in ("log", "metrics", "bench")]
    calls += [("analyze", {"inputs": [tp], "model": str(root / "config.json")})]
    calls += [("check", {"inputs": [tp], "baseline": str(fifo)}), ("query", {"run": str(fifo), "sql": "SELECT 1"})]
    (root / "traces").mkdir()
    os.mkfifo(root / "traces" / "rank0.pt.trace.json")  # a folder of traces holding a pipe
    calls += [("analyze", {"inputs": [str(root / "traces")]})]
    run = root / "run"  # a run folder whose trace.duckdb is then a pipe
    calls += [("query", {"run": str(run), "sql": "SELECT 1"}), ("diff", {"before": str(run), "after": str(run)})]
    got: list[tuple[tuple[str, dict], str, float]] = []

    async def session() -> None:
        async with Client(_server(root / "runs", root, root, Path("/dev")), read_timeout_seconds=60) as c:
            assert not (await c.call_tool("analyze", {"inputs": [tp], "out": str(run)})).is_error
            (run / "trace.duckdb").unlink()
            os.mkfifo(run / "trace.duckdb")
            for name, args in calls:
                t0 = time.monotonic()
                with anyio.fail_after(30):
                    r = await c.call_tool(name, args)
                got.append(((name, args), _error_line(r), time.monotonic() - t0))

    asyncio.run(session())
    for (name, args), text, seconds in got:
        assert seconds < 10, (name, args, seconds)
        assert SECRET not in text and "\x00" not in text, text
        named = next(v for v in (*args.get("inputs", []), *args.values()) if isinstance(v, str) and v != tp)
        assert named in text or Path(named).name in text, (name, args, text)
        if "/dev/zero" in (*args.values(), *args.get("inputs", [])):
            assert "a character device, not a regular file" in text, text
        if str(fifo) in (*args.values(), *args.get("inputs", [])) and name == "analyze":
            assert "a named pipe (FIFO), not a regular file" in text, text
    link = next(text for (_, args), text, _ in got if args.get("model") == str(root / "config.json"))
    assert "outside the allowed roots" in link, link
