"""`tracediag mcp` driven by the MCP SDK's own client over stdio (`python -m tracediag mcp` as a subprocess), on
the real sample traces: analyze with progress, findings, explain, query (a DROP TABLE refused, the table intact),
diff with its comparability verdict, check, the column-doc resources, and errors as tool errors that leave the
server running. One server session for the module; each test reads what it did."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SAMPLES
from mcp import Client, StdioServerParameters

from tracediag.rules import RULE_MODULES

TP1 = SAMPLES / "healthy_tp1"
TP2 = SAMPLES / "healthy_tp2"
EXT = REPO / "tests" / "data" / "external"
# the inputs besides traces and model that `tracediag analyze` takes, as tool arguments, and the rule each enables
EVERY_INPUT = {
    "topology": str(REPO / "tests" / "data" / "topology" / "h100x2_nvswitch.topo.json"),
    "nccl_tests": [str(EXT / "nccl-tests" / "h100x2_all_reduce_perf.txt")],
    "bench": str(EXT / "vllm" / "bench" / "vllm-0.33.0_rate6_save-detailed.json"),
    "slo": "ttft=500,tpot=50",
    "hbm_bandwidth": 3350.0,
    "memory_limit": "1GiB",
}
ENABLED = {"PATH001": "topology", "PATH002": "nccl_tests", "SCH010": "slo", "KRN005": "hbm_bandwidth"}


def _env() -> dict[str, str]:
    # the checkout under test first (the client passes only a safe subset of the environment on)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _session(runs: Path, store: Path) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tracediag", "mcp", "--runs-dir", str(runs), "--allow-root", str(REPO), "--allow-root",
              str(store.parent)],
        env=_env(),
        cwd=str(REPO),
    )  # fmt: skip
    got: dict[str, Any] = {"progress": []}

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got["progress"].append((progress, message))

    async with Client(params, read_timeout_seconds=240) as c:
        call = c.call_tool
        got["tools"] = {t.name: t for t in (await c.list_tools()).tools}
        got["analyze"] = await call("analyze", {"inputs": [str(TP1)], "model": str(TP1 / "config.json")},
                                    progress_callback=on_progress)  # fmt: skip
        run = got["analyze"].structured_content["run"]
        got["analyze_inputs"] = await call(
            "analyze", {"inputs": [str(TP2)], "model": str(TP2 / "config.json"), **EVERY_INPUT}
        )
        got["findings"] = await call("findings", {"run": run})
        got["explain"] = await call("explain", {"run": run, "rule": "sch001"})
        got["explain_unknown"] = await call("explain", {"run": run, "rule": "NOPE001"})
        count = "SELECT count(*) AS n FROM steps"
        got["count_before"] = await call("query", {"run": run, "sql": count})
        got["db_before"] = _sha256(Path(run) / "trace.duckdb")
        got["drop"] = await call("query", {"run": run, "sql": "DROP TABLE steps"})
        got["two"] = await call("query", {"run": run, "sql": "SELECT 1; DROP TABLE steps"})
        got["file"] = await call("query", {"run": run, "sql": "SELECT * FROM read_text('/etc/hostname')"})
        got["count_after"] = await call("query", {"run": run, "sql": count})
        got["db_after"] = _sha256(Path(run) / "trace.duckdb")
        got["capped"] = await call("query", {"run": run, "sql": "SELECT * FROM cpu_ops", "max_rows": 3})
        got["slow"] = await call("query", {"run": run, "sql": "SELECT count(*) FROM range(100000000000)",
                                           "time_limit_s": 0.5})  # fmt: skip
        got["missing"] = await call("findings", {"run": str(runs / "nope")})
        got["store"] = await call("findings", {"run": str(store)})
        got["store_again"] = await call("findings", {"run": str(store)})
        got["analyze_tp2"] = await call("analyze", {"inputs": [str(TP2)], "model": str(TP2 / "config.json")})
        run2 = got["analyze_tp2"].structured_content["run"]
        got["diff"] = await call("diff", {"before": run, "after": run2})
        got["diff_forced"] = await call("diff", {"before": run, "after": run2, "force_compare": True})
        got["diff_same"] = await call("diff", {"before": run2, "after": run2})
        got["check"] = await call("check", {"inputs": [str(TP1)], "model": str(TP1 / "config.json"),
                                            "require": "KRN007"})  # fmt: skip
        got["resources"] = [str(r.uri) for r in (await c.list_resources()).resources]
        got["steps_doc"] = (await c.read_resource("tracediag://tables/steps")).contents[0].text
        got["still_alive"] = await call("findings", {"run": run})
    got["run"], got["run2"] = Path(run), Path(run2)
    return got


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("store") / "tp2.store"  # a Parquet store, as `tracediag ingest` writes it
    r = subprocess.run([sys.executable, "-m", "tracediag", "ingest", str(TP2), "--store", str(store), "-q"],
                       capture_output=True, text=True, env={**os.environ, **_env()}, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return asyncio.run(_session(tmp_path_factory.mktemp("runs"), store))


def test_tools_have_json_schemas_and_output_schemas(session):
    tools = session["tools"]
    assert set(tools) == {"analyze", "findings", "explain", "query", "diff", "check"}
    props = tools["analyze"].input_schema["properties"]
    assert props["inputs"]["type"] == "array" and props["inputs"]["items"] == {"type": "string"}
    assert {"model", "out", "log", "metrics", "bench", "tp"} <= set(props) and "ctx" not in props
    assert tools["analyze"].input_schema["required"] == ["inputs"]
    assert {"integer", "null"} == {t["type"] for t in props["tp"]["anyOf"]}
    assert set(tools["query"].input_schema["required"]) == {"run", "sql"}
    for name, t in tools.items():
        assert t.output_schema and t.output_schema["type"] == "object", name


PATHS = {"inputs", "model", "out", "log", "metrics", "bench", "run", "before", "after", "baseline", "config"}


def test_every_parameter_says_what_it_is_its_unit_and_range(session):
    tools = session["tools"]
    for name, t in tools.items():
        for arg, prop in t.input_schema["properties"].items():
            assert len(prop.get("description", "")) > 20, (name, arg)
            if arg in PATHS:
                assert "allowed roots" in prop["description"], (name, arg)
    for name in ("analyze", "check"):
        tp = tools[name].input_schema["properties"]["tp"]
        assert (tp["minimum"], tp["maximum"]) == (1, 4096) and "tensor-parallel degree" in tp["description"]
        assert "1 to 4,096" in tp["description"]
    q = tools["query"].input_schema["properties"]
    assert (q["max_rows"]["minimum"], q["max_rows"]["maximum"]) == (1, 10_000)
    assert q["time_limit_s"]["maximum"] == 120 and "seconds" in q["time_limit_s"]["description"]
    fail_on = tools["check"].input_schema["properties"]["fail_on"]["anyOf"][0]
    assert fail_on["enum"] == ["info", "warning", "error"]


def test_annotations_are_true_a_tool_that_writes_is_not_read_only(session):
    hints = {n: t.annotations for n, t in session["tools"].items()}
    for name in ("analyze", "check", "diff"):  # each writes with `out` (analyze also without)
        assert hints[name].read_only_hint is False and hints[name].destructive_hint is True, name
    for name in ("findings", "explain", "query"):
        assert hints[name].read_only_hint is True and hints[name].idempotent_hint is True, name
    assert all(h.open_world_hint is False for h in hints.values())


def test_output_schemas_type_the_fields(session):
    schemas = {n: t.output_schema for n, t in session["tools"].items()}
    defs = schemas["diff"]["$defs"]
    comp = defs["Comparability"]["properties"]
    assert comp["comparable"]["type"] == "boolean" and comp["aspects"]["items"] == {"$ref": "#/$defs/Aspect"}
    assert defs["Aspect"]["properties"]["status"]["type"] == "string"
    assert schemas["diff"]["properties"]["findings"] == {"$ref": "#/$defs/FindingChanges"}
    assert schemas["check"]["properties"]["outcome"]["enum"] == ["passed", "failed", "inconclusive"]
    assert schemas["check"]["properties"]["outcomes"]["items"] == {"$ref": "#/$defs/JudgedItem"}
    assert schemas["explain"]["properties"]["evidence"]["items"] == {"$ref": "#/$defs/Evidence"}
    assert schemas["analyze"]["properties"]["findings"]["items"] == {"$ref": "#/$defs/Finding"}
    assert schemas["analyze"]["properties"]["kept"]["type"] == "boolean"
    assert schemas["query"]["properties"]["rows"]["items"]["type"] == "array"
    assert "max_rows" in schemas["query"]["properties"]["truncated_by"]["description"]  # fields say what they mean
    assert "exit status" in schemas["check"]["properties"]["exit_code"]["description"]
    # the SDK client validated every structured result against these schemas; the typed rows came through whole
    d = session["diff_forced"].structured_content
    assert d["tool"]["name"] == "tracediag" and d["dispatch"]  # fields beyond the declared ones are kept
    assert {a["status"] for a in d["comparability"]["aspects"]} >= {"same", "not comparable"}


def test_every_input_of_the_cli_reaches_the_analysis_as_a_tool_argument(session):
    """topology, nccl-tests, bench, SLO, bandwidth and memory limit given to the tool enable the rules they enable on
    the command line, and the tool's schema describes each (with the same inputs the CLI's analyze has)."""
    r = session["analyze_inputs"]
    assert not r.is_error, r.content
    doc = json.loads((Path(r.structured_content["run"]) / "findings.json").read_text())
    status = {c["rule"]: c["status"] for c in doc["checks"]}
    assert all(status[rule] != "not_applicable" for rule in ENABLED), status
    props = session["tools"]["analyze"].input_schema["properties"]
    assert all(props[name].get("description") for name in ENABLED.values())


def test_analyze_returns_verdict_coverage_and_ranked_findings_with_progress(session):
    r = session["analyze"]
    assert not r.is_error, r.content
    s = r.structured_content
    run = session["run"]
    assert Path(s["run"]) == run and run.parent.name.startswith("runs")
    assert s["kept"] is True and s["kept_note"] == (
        f"kept: {run} is in the runs folder {run.parent} (--runs-dir); the folder keeps the last 100 runs (--keep-runs)"
    )
    doc = json.loads((run / "findings.json").read_text())  # what the CLI's analyze writes
    assert s["verdict"]["headline"] == doc["verdict"]["headline"] and s["verdict"]["rule"] == doc["verdict"]["rule"]
    assert s["coverage"]["rules"] == len(RULE_MODULES)
    # the coverage's advice names what an agent can pass: the tools' arguments, not the CLI's flags
    cli_text, text = doc["verdict"]["coverage_text"], s["coverage"]["text"]
    assert "pass --log to enable" in cli_text and "pass the `log` argument to enable" in text
    assert " --" not in text and text.split(":")[0] == cli_text.split(":")[0]
    assert {e["argument"] for e in s["coverage"]["enable"]} >= {"log", "topology", "metrics"}
    assert [f["id"] for f in s["findings"]] == [f["rule"] for f in doc["findings"]]
    assert all(f["title"] and isinstance(f["impact"], float) for f in s["findings"])
    assert json.loads(r.content[0].text) == s  # the same result as text for clients without structured output
    stages = [m for _, m in session["progress"]]
    assert stages[0].startswith("reading 1 file") and f"running {len(RULE_MODULES)} rules" in stages
    assert [p for p, _ in session["progress"]] == list(range(1, len(stages) + 1))  # increasing


def test_findings_of_an_existing_run_are_the_same(session):
    assert session["findings"].structured_content == session["analyze"].structured_content
    assert session["still_alive"].structured_content == session["analyze"].structured_content


def test_findings_of_a_parquet_store_analyse_it_once(session):
    s = session["store"].structured_content
    assert not session["store"].is_error, session["store"].content
    assert s["tp"] == 2 and s["coverage"]["rules"] == len(RULE_MODULES) and s["findings"]
    assert Path(s["run"]).parent == session["run"].parent  # analysed into the runs folder...
    assert session["store_again"].structured_content == s  # ... once: the same run the second time


def test_explain_gives_formula_values_evidence_and_next_check(session):
    e = session["explain"].structured_content
    doc = json.loads((session["run"] / "findings.json").read_text())
    (c,) = [c for c in doc["checks"] if c["rule"] == "SCH001"]
    assert e["rule"] == "SCH001" and e["status"] == c["status"]
    assert e["formula"] == c["formula"] and e["substituted"] == c["substituted"] and e["values"] == c["values"]
    assert e["evidence"] == c["evidence"] and e["evidence"] and e["next_check"] == c["next_check"]
    assert e["walk_step"] == "Scheduling & queueing" and e["about"].startswith("SCH001 ")
    bad = session["explain_unknown"]
    assert bad.is_error and bad.content[0].text.startswith("tracediag: error: explain: no rule 'NOPE001' in ")


def test_query_is_read_only_capped_and_time_limited(session):
    before = session["count_before"].structured_content
    assert before["columns"] == ["n"] and before["types"] == ["BIGINT"] and before["rows"][0][0] == 7
    for key, why in (("drop", "not DROP"), ("two", "exactly one SQL statement (got 2)")):
        r = session[key]
        assert r.is_error and r.content[0].text.startswith("tracediag: error: query: "), r.content
        assert why in r.content[0].text and "\n" not in r.content[0].text
    assert "only a read-only SELECT is allowed, not DROP; nothing was run" in session["drop"].content[0].text
    assert session["file"].is_error and "file system operations are disabled" in session["file"].content[0].text
    # the table is intact and the file unchanged
    assert session["count_after"].structured_content["rows"] == before["rows"]
    assert session["db_after"] == session["db_before"]
    capped = session["capped"].structured_content
    assert capped["row_count"] == 3 and len(capped["rows"]) == 3 and capped["truncated"] is True
    assert "name" in capped["columns"]
    slow = session["slow"]
    assert slow.is_error and "stopped at the time limit (0.5 s)" in slow.content[0].text


def test_errors_are_the_cli_line_and_the_server_goes_on(session):
    r = session["missing"]
    assert (
        r.is_error
        and r.content[0].text == f"tracediag: error: {session['run'].parent / 'nope'}: no such file or directory"
    )
    assert not session["still_alive"].is_error


def test_diff_says_not_comparable_and_forced_compares(session):
    d = session["diff"].structured_content
    assert d["comparability"]["comparable"] is False
    assert d["comparability"]["verdict"] == "not comparable: TP 1 → 2"
    assert d["fingerprints"]["before"]["layout"]["tp"] == 1 and d["fingerprints"]["after"]["layout"]["tp"] == 2
    assert d["headlines"] == [] and d["step_time"] == []
    forced = session["diff_forced"].structured_content
    assert forced["comparability"]["forced"] is True and forced["step_time"]
    assert forced["headlines"][0].startswith("compared anyway (--force-compare), although not comparable: TP 1 → 2")
    same = session["diff_same"].structured_content
    assert same["comparability"]["verdict"] == "comparable" and same["headlines"] == []


def test_check_outcome_as_the_command_gives_it(session):
    c = session["check"].structured_content
    assert c["outcome"] == "inconclusive" and c["exit_code"] == 4
    assert c["inconclusive"] == [f"required rule KRN007 could not run: {_reason(c, 'KRN007')}"]
    assert c["text"].splitlines()[-1].startswith("INCONCLUSIVE: 1 required rule(s) could not run: KRN007 — ")


def _reason(check: dict, rule: str) -> str:
    (o,) = [o for o in check["outcomes"] if o["id"] == rule]
    assert o["status"] == "skipped" and o["required"] is True
    return o["message"].removeprefix("required, but could not run: ")


def test_column_docs_are_resources(session):
    assert "tracediag://tables" in session["resources"]
    assert {"tracediag://tables/steps", "tracediag://tables/collectives", "tracediag://tables/bench_runs"} <= set(
        session["resources"]
    )
    doc = session["steps_doc"]
    assert doc.startswith("# steps\n") and "| `dur_ns` |" in doc and "| `T` |" in doc


def test_without_the_sdk_the_command_says_what_to_install():
    # the SDK made unimportable in this process only
    script = (
        "import sys; sys.modules['mcp'] = None; from tracediag.cli import main; sys.argv = ['tracediag', 'mcp']; main()"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, **_env()},
                       timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr == (
        "tracediag: error: tracediag mcp needs the MCP Python SDK (mcp>=2.3,<3): pip install 'mcp>=2.3,<3' "
        "(or pip install '.[mcp]' in tracediag's clone)\n"
    )


def test_with_the_wrong_sdk_major_the_command_names_the_installed_version():
    # the installed distribution's metadata says 1.26.0 (the SDK's last v1 line), in this process only
    script = (
        "import importlib.metadata as m; real = m.version; "
        "m.version = lambda name: '1.26.0' if name == 'mcp' else real(name); "
        "from tracediag.cli import main; import sys; sys.argv = ['tracediag', 'mcp']; main()"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, **_env()},
                       timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith("tracediag: error: tracediag mcp needs the MCP Python SDK mcp>=2.3,<3, and mcp 1.26.0 "
                               "is installed (its v1 API is another): pip install 'mcp>=2.3,<3'"), r.stderr  # fmt: skip
    assert "is missing" not in r.stderr and "\n" not in r.stderr.rstrip("\n")


@pytest.mark.parametrize(
    ("version", "ok"), [("2.3.0", True), ("2.10.1", True), ("2.2.9", False), ("1.26.0", False), ("3.0.0", False)]
)
def test_the_sdk_range_is_the_extras(version, ok):
    from tracediag.cli.mcp import SDK_RANGE, sdk_problem

    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'mcp = ["{SDK_RANGE}"]' in pyproject  # the range the message names is the one the extra installs
    assert (sdk_problem(version) is None) is ok
