"""No output option ever writes onto an input, nor onto a file tracediag did not write without --force; our own
outputs read back (run folders, findings.json, stores, baselines) that are damaged are one-line input errors;
bad option values are one-line usage errors; SIGTERM inside a DuckDB query is exit 143.

Every command runs as the installed console script would (`python -m tracediag`), so the exit codes and the stderr
lines are the ones a user and a CI job see.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXTERNAL, SAMPLES

HEALTHY1 = SAMPLES / "healthy_tp1"
TRACE = HEALTHY1 / "rank0.pt.trace.json.gz"
CONFIG = HEALTHY1 / "config.json"
GPTOSS = EXTERNAL / "kineto" / "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"


def run(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracediag", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def one_error_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracediag: error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def trace_copy(tmp_path) -> Path:
    """The user's input trace, in a folder of the test's own (so a bug that overwrites it harms nothing)."""
    d = tmp_path / "user"
    d.mkdir()
    shutil.copy(TRACE, d / TRACE.name)
    return d / TRACE.name


# --- data loss: an output onto an input -----------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--annotated-trace", "--junit"])
@pytest.mark.parametrize("via", ["same path", "symlink", "hard link"])
def test_check_never_writes_its_output_onto_the_input_trace(tmp_path, trace_copy, option, via):
    before = digest(trace_copy)
    target = trace_copy
    if via == "symlink":
        target = tmp_path / "link.json.gz"
        target.symlink_to(trace_copy)
    elif via == "hard link":
        target = tmp_path / "hard.json.gz"
        os.link(trace_copy, target)
    r = run("check", trace_copy, "-m", CONFIG, option, target, "-q")
    one_error_line(r, option, "is one of the inputs")
    assert digest(trace_copy) == before
    r = run("check", trace_copy, "-m", CONFIG, option, target, "-q", "--force")  # --force never allows it
    one_error_line(r, "is one of the inputs")
    assert digest(trace_copy) == before


def test_no_output_onto_a_side_input(tmp_path, trace_copy):
    log = tmp_path / "server.log"
    shutil.copy(EXTERNAL / "vllm" / "log_excerpts" / "vllm-6689_v0_healthy_idle.log", log)
    before = digest(log)
    one_error_line(run("check", trace_copy, "--log", log, "--junit", log, "-q"), "--junit", "inputs")
    one_error_line(run("check", trace_copy, "-m", CONFIG, "--junit", CONFIG, "-q"), "inputs")
    assert digest(log) == before


def test_out_folder_that_is_an_input_folder_is_refused(tmp_path, trace_copy):
    one_error_line(run("analyze", trace_copy.parent, "-o", trace_copy.parent, "-q"), "--out", "is one of the inputs")
    assert sorted(p.name for p in trace_copy.parent.iterdir()) == [TRACE.name]


def test_a_file_tracediag_did_not_write_needs_force(tmp_path, trace_copy):
    out = tmp_path / "out"
    out.mkdir()
    notes = out / "report.html"
    notes.write_text("<html>my own notes</html>")
    one_error_line(run("analyze", trace_copy, "-o", out, "-q"), "report.html", "tracediag did not write", "--force")
    assert notes.read_text() == "<html>my own notes</html>"
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]  # nothing written beside it either
    r = run("analyze", trace_copy, "-o", out, "-q", "--force")
    assert r.returncode == 0, r.stderr
    assert 'content="tracediag"' in notes.read_text()
    # the next run replaces what tracediag wrote without --force
    assert run("analyze", trace_copy, "-o", out, "-q").returncode == 0


def test_junit_and_annotated_trace_replace_only_their_own_files(tmp_path, trace_copy):
    junit, marked = tmp_path / "rules.xml", tmp_path / "marked.json.gz"
    r = run("check", trace_copy, "-m", CONFIG, "--junit", junit, "--annotated-trace", marked, "-q")
    assert r.returncode in (0, 1), r.stderr
    r = run("check", trace_copy, "-m", CONFIG, "--junit", junit, "--annotated-trace", marked, "-q")
    assert r.returncode in (0, 1), r.stderr  # ours: replaced without --force
    other = tmp_path / "other.xml"
    other.write_text("<testsuites name='another tool'/>")
    one_error_line(run("check", trace_copy, "-m", CONFIG, "--junit", other, "-q"), "did not write")
    assert other.read_text() == "<testsuites name='another tool'/>"
    one_error_line(run("check", trace_copy, "--junit", junit, "--annotated-trace", junit, "-q"), "each its own file")


def test_diff_out_refuses_a_foreign_diff_json(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "diff.json").write_text('{"mine": true}')
    one_error_line(run("diff", TRACE, TRACE, "-o", out, "-q"), "diff.json", "did not write")
    assert (out / "diff.json").read_text() == '{"mine": true}'


def test_scrape_out_refuses_a_foreign_file(tmp_path):
    keep = tmp_path / "metrics.prom"
    keep.write_text("my_metric 1\n")
    one_error_line(run("scrape", "http://127.0.0.1:9/metrics", "-o", keep, "--duration", "1s"), "did not write")
    assert keep.read_text() == "my_metric 1\n"


@pytest.mark.parametrize("command", ["analyze", "check", "diff", "ingest"])
def test_empty_output_path_is_refused_not_the_current_folder(tmp_path, trace_copy, command):
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "report.html").write_text("keep")
    args = {
        "analyze": ["analyze", trace_copy, "-o", ""],
        "check": ["check", trace_copy, "-o", ""],
        "diff": ["diff", trace_copy, trace_copy, "-o", ""],
        "ingest": ["ingest", trace_copy, "--store", ""],
    }[command]
    one_error_line(run(*args, cwd=work), "empty path")
    assert sorted(p.name for p in work.iterdir()) == ["report.html"]
    assert (work / "report.html").read_text() == "keep"


# --- our own outputs read back --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "out"
    r = run("analyze", TRACE, "-m", CONFIG, "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    return out


def _copy_run(run_folder: Path, dest: Path) -> Path:
    shutil.copytree(run_folder, dest)
    return dest


def test_diff_of_a_run_folder_whose_store_is_not_duckdb(tmp_path, run_folder):
    bad = _copy_run(run_folder, tmp_path / "bad")
    (bad / "trace.duckdb").write_bytes(b"this is not a database\n" * 100)
    one_error_line(run("diff", run_folder, bad, "-o", tmp_path / "d", "-q"), str(bad / "trace.duckdb"), "not a DuckDB")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "damage",
    [
        ("checks", 5),
        ("checks.0.status", 3),
        ("checks.0.rule", None),
        ("checks.0.values", "a string"),
        ("inputs", 7),
        ("inputs.0.ranks", "zero"),
        ("sections", [1, 2]),
        ("sections.steps.tables", 4),
        ("sections.steps.tables.*.0.dur_ns", "slow"),
        ("schema", 1),
    ],
    ids=lambda d: f"{d[0]}={d[1]!r}",
)
def test_diff_and_check_of_a_findings_json_with_wrong_types(tmp_path, run_folder, damage):
    bad = _copy_run(run_folder, tmp_path / "bad")
    doc = json.loads((bad / "findings.json").read_text())
    where, value = damage
    node, keys = doc, where.split(".")
    for k in keys[:-1]:
        node = next(iter(node.values())) if k == "*" else node[int(k)] if isinstance(node, list) else node[k]
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    (bad / "findings.json").write_text(json.dumps(doc))
    (bad / "trace.duckdb").unlink()  # findings.json alone: every measure is then read from the document
    for r in (
        run("diff", run_folder, bad / "findings.json", "-o", tmp_path / "d", "-q"),
        run("diff", bad, run_folder, "-o", tmp_path / "d", "-q"),
        run("check", TRACE, "-m", CONFIG, "--baseline", bad / "findings.json", "-q"),
    ):
        one_error_line(r, str(bad))


def test_check_with_a_truncated_baseline(tmp_path, run_folder):
    bad = _copy_run(run_folder, tmp_path / "bad")
    data = (bad / "findings.json").read_bytes()
    (bad / "findings.json").write_bytes(data[: len(data) // 2])
    one_error_line(run("check", TRACE, "-m", CONFIG, "--baseline", bad, "-q"), str(bad / "findings.json"), "JSON")


def test_a_findings_json_of_a_newer_schema_says_so(tmp_path, run_folder):
    bad = _copy_run(run_folder, tmp_path / "bad")
    doc = json.loads((bad / "findings.json").read_text())
    doc["schema"] = "tracediag/findings-v7"
    (bad / "findings.json").write_text(json.dumps(doc))
    one_error_line(run("diff", run_folder, bad, "-q", "-o", tmp_path / "d"), "newer", "upgrade tracediag")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("store") / "s"
    r = run("ingest", TRACE, "--store", s, "-q")
    assert r.returncode == 0, r.stderr
    return s


def test_analyze_of_a_store_with_a_truncated_parquet_file(tmp_path, store):
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    victim = max((bad / "tables").rglob("*.parquet"), key=lambda f: f.stat().st_size)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    one_error_line(run("analyze", "--store", bad, "-o", tmp_path / "o", "-q"), str(victim), "truncated", "ingest")
    assert not (tmp_path / "o").exists()


def test_ingest_under_a_path_that_cannot_be_created(tmp_path, trace_copy):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    one_error_line(run("ingest", trace_copy, "--store", blocker / "store", "-q"), "--store", "cannot write")


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs a private mount namespace")
def test_ingest_on_a_read_only_file_system(tmp_path, trace_copy):
    vol = tmp_path / "vol"
    vol.mkdir()
    script = (
        f"mount -t tmpfs -o ro none {vol} && {sys.executable} -m tracediag ingest {trace_copy} --store {vol}/store -q"
    )
    r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    one_error_line(r, "--store", "Read-only file system")


def test_ingest_store_that_is_an_input_folder(tmp_path, trace_copy):
    one_error_line(run("ingest", trace_copy.parent, "--store", trace_copy.parent, "-q"), "is one of the inputs")
    assert sorted(p.name for p in trace_copy.parent.iterdir()) == [TRACE.name]


# --- option values --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--jobs", "0"], "--jobs"),
        (["--tp", "0"], "--tp"),
        (["--tp", "abc"], "--tp"),
        (["--tp", "99999999999999999999"], "--tp"),
        (["--hbm-bandwidth", "nan"], "--hbm-bandwidth"),
        (["--hbm-bandwidth", "inf"], "--hbm-bandwidth"),
        (["--peak-tflops", "-1"], "--peak-tflops"),
        (["--slo", "ttft=nan"], "--slo"),
        (["--slo", "ttft=inf"], "--slo"),
        (["--slo", ""], "--slo"),
        (["--memory-limit", "lots"], "--memory-limit"),
        (["--no-such-option"], "--no-such-option"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_bad_option_values_are_one_line_usage_errors(tmp_path, args, needle):
    one_error_line(run("analyze", TRACE, "-o", tmp_path / "o", "-q", *args), needle)
    assert not (tmp_path / "o").exists()


def test_a_kv_usage_of_minus_1e308_is_no_warning_on_stderr(tmp_path):
    from tracediag.live.scrape import scrape_block

    body = (EXTERNAL / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom").read_text()
    gauge = 'vllm:kv_cache_usage_perc{engine="0",model_name="zai-org/GLM-4.5"} '
    real = next(line for line in body.splitlines() if line.startswith(gauge))
    blocks = [
        scrape_block(body.replace(real, gauge + v), i, 1753795326935 + 1000 * i, "http://127.0.0.1:8000/metrics")
        for i, v in enumerate(["0.5", "-1e308", "0.7", "1e308"])
    ]
    prom = tmp_path / "m.prom"
    prom.write_text("".join(blocks))
    r = run("analyze", "--metrics", prom, "-o", tmp_path / "o", "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    checks = json.loads((tmp_path / "o" / "findings.json").read_text())["checks"]
    sch004 = next(c for c in checks if c["rule"] == "SCH004")
    assert sch004["status"] != "not_applicable" and "70" in json.dumps(sch004["values"])  # the real samples are read


# --- signals inside DuckDB ------------------------------------------------------------------------------------


def test_sigterm_inside_a_duckdb_query_is_143_and_no_output(tmp_path):
    """A real trace's analysis is signalled at several points; most land in DuckDB's derivations and rule queries
    (parsing takes the first fraction of the run). Before the fix a signal there gave exit 3 'Query interrupted'."""
    landed = 0
    for delay in (0.05, 0.15, 0.25, 0.35, 0.5, 0.7):
        out = tmp_path / f"o{delay}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracediag", "analyze", GPTOSS, "-o", out, "-q", "--jobs", "1"],
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60  # the run has started (its staging folder exists): past start-up
        while not any(p.name.endswith(".partial") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0 or (out / "findings.json").exists():
            continue  # the run had written its outputs before the signal (a fast machine): nothing to judge
        landed += 1
        assert proc.returncode == 143, err
        assert err.strip().splitlines() == ["tracediag: terminated; no output written"]
        assert not out.exists()
    assert landed >= 3


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(inputs=None),
        lambda m: m.update(tool=7, schema_version="another"),
        lambda m: m["views"].update(views=[1, "a"]),
        lambda m: m["views"].update(step_collectives="CREATE VIEW step_collectives AS SELECT 1; COPY steps TO 'x.csv'"),
        lambda m: m["views"].update(x="COPY (SELECT 1) TO '/tmp/pwned.csv'"),
        lambda m: m["tables"].update({"steps; DROP TABLE kernels": m["tables"]["steps"]}),
        lambda m: m["tables"]["steps"]["columns"].append(["x", "INTEGER); COPY steps TO 'y.csv'; --"]),
    ],
    ids=["inputs null", "tool not a table", "view not text", "two statements", "a COPY", "table name", "column type"],
)
def test_a_store_manifest_that_is_not_ours_runs_no_sql(tmp_path, store, edit):
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    edit(manifest)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    for r in (run("check", "--store", bad, "-q", cwd=tmp_path), run("analyze", "--store", bad, "-o", tmp_path / "o")):
        one_error_line(r, str(bad))
    assert not list(tmp_path.glob("*.csv")) and not Path("/tmp/pwned.csv").exists()


def test_a_config_that_is_a_fifo_is_refused_not_waited_for(tmp_path):
    fifo = tmp_path / "tracediag.toml"
    os.mkfifo(fifo)
    one_error_line(run("check", TRACE, "-m", CONFIG, "--config", fifo, "-q", timeout=120), str(fifo), "FIFO")
