"""The command line as users run it: exit codes, one-line errors, no partial outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

HEALTHY = SAMPLES / "healthy_tp2"
RANK0 = HEALTHY / "rank0.pt.trace.json.gz"


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracediag", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_analyze_healthy_writes_three_outputs(tmp_path):
    out = tmp_path / "out"
    r = run("analyze", HEALTHY, "--model", HEALTHY / "config.json", "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    doc = json.loads((out / "findings.json").read_text())
    assert doc["schema"] == "tracediag/findings-v1"
    statuses = {c["rule"]: c["status"] for c in doc["checks"]}
    assert {r: statuses[r] for r in ("SHP001", "SHP002", "COL001", "COL002")} == dict.fromkeys(
        ("SHP001", "SHP002", "COL001", "COL002"), "pass"
    )
    col001 = next(c for c in doc["checks"] if c["rule"] == "COL001")
    assert col001["values"]["2L"] == 8 and col001["values"]["all_reduce_per_step_mode"] == 9
    col002 = next(c for c in doc["checks"] if c["rule"] == "COL002")
    assert col002["values"]["e_a"] == 2 and col002["values"]["example_expected_bytes"] == (
        col002["values"]["example_T"] * 256 * 2
    )
    for inp in doc["inputs"]:
        assert set(inp["counts"]) >= {"kernels", "cpu_ops", "collectives", "steps"}
        assert inp["format"] == "kineto" and len(inp["ranks"]) == 1
    assert "COL001" in r.stdout and "report.html" in r.stdout
    # no staging leftovers next to the output
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_fault_trace_exit_zero_with_finding(tmp_path):
    d = SAMPLES / "fault_fp32_comm_tp2"
    r = run("analyze", d, "-m", d / "config.json", "-o", tmp_path / "o", "-q")
    assert r.returncode == 0 and r.stdout == ""
    doc = json.loads((tmp_path / "o" / "findings.json").read_text())
    assert "COL002" in [f["rule"] for f in doc["findings"]]
    assert doc["cost_model"]["applies"] is False


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str | Path], str]]:
    raw = gzip.decompress(RANK0.read_bytes())
    not_json = tmp / "notes.json"
    not_json.write_text("this is a log line, not JSON\n")
    trunc_gz = tmp / "rank0.pt.trace.json.gz"
    trunc_gz.write_bytes(RANK0.read_bytes()[: RANK0.stat().st_size // 2])
    trunc_json = tmp / "cut.json"
    trunc_json.write_bytes(raw[: len(raw) // 3])
    doc = json.loads(raw)
    empty = tmp / "empty.json"
    empty.write_text(json.dumps({**doc, "traceEvents": []}))
    cfg = json.loads((HEALTHY / "config.json").read_text())
    del cfg["hidden_size"]
    bad_cfg = tmp / "config_no_hidden.json"
    bad_cfg.write_text(json.dumps(cfg))
    model = HEALTHY / "config.json"
    return {
        "not JSON": ([not_json, "-m", model], "not valid JSON"),
        "truncated gzip": ([trunc_gz, "-m", model], "gzip"),
        "truncated JSON": ([trunc_json, "-m", model], "truncated JSON"),
        "JSON that is not a trace": ([model, "-m", model], "unrecognised input: not a Kineto trace"),
        "empty trace": ([empty, "-m", model], "no events"),
        "config without hidden_size": ([RANK0, "-m", bad_cfg], "hidden_size"),
        "missing file": ([tmp / "nope.json"], "no such file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "not JSON",
        "truncated gzip",
        "truncated JSON",
        "JSON that is not a trace",
        "empty trace",
        "config without hidden_size",
        "missing file",
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, case):
    inputs = tmp_path / "in"
    inputs.mkdir()
    args, needle = _bad_inputs(inputs)[case]
    work = tmp_path / "work"
    work.mkdir()
    r = run("analyze", *args, "--out", work / "out")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracediag: error: "), r.stderr
    assert needle in lines[0]
    bad_file = [a for a in args if isinstance(a, Path)][-1 if case == "config without hidden_size" else 0]
    assert str(bad_file) in lines[0]
    assert list(work.iterdir()) == []  # no partial outputs, no staging folder


def test_failed_run_keeps_previous_outputs(tmp_path):
    out = tmp_path / "out"
    assert run("analyze", HEALTHY, "-m", HEALTHY / "config.json", "-o", out, "-q").returncode == 0
    before = (out / "findings.json").read_bytes()
    r = run("analyze", tmp_path / "missing.json", "-o", out)
    assert r.returncode == 2
    assert (out / "findings.json").read_bytes() == before


def test_usage_error_exit_2():
    r = run("analyze")
    assert r.returncode == 2


# --- output faults: mount points, read-only and full file systems, clashes, signals, killed runs ------------------


def _mount_namespace() -> list[str] | None:
    """A command prefix that runs a shell script in a private mount namespace (so tmpfs mounts made there vanish
    with it), or None where this machine does not allow one (no unshare, no user namespaces)."""
    import os
    import shutil

    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--mount", "--map-root-user"]
    probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || mount -t tmpfs none /tmp"],
                           capture_output=True, timeout=30)  # fmt: skip
    return prefix if probe.returncode == 0 else None


MOUNT_NS = _mount_namespace()
needs_mounts = pytest.mark.skipif(MOUNT_NS is None, reason="no private mount namespace here (unshare); the "
                                  "same-file-system logic is tested without mounts below")  # fmt: skip


def _in_mount_ns(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env_py = f"{sys.executable} -m tracediag"
    return subprocess.run([*MOUNT_NS, "sh", "-c", script.replace("TRACEDIAG", env_py)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)  # fmt: skip


@needs_mounts
def test_out_on_a_tmpfs_mount_point(tmp_path):
    """--out is a mount point (a container volume): staging inside it, so every move is a rename on one file
    system (was exit 3, 'Invalid cross-device link')."""
    vol = tmp_path / "vol"
    vol.mkdir()
    r = _in_mount_ns(
        f"mount -t tmpfs -o size=64m none {vol} && TRACEDIAG analyze {HEALTHY} -o {vol} -q; rc=$?; "
        f"ls -A {vol}; exit $rc",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["findings.json", "report.html", "trace.duckdb"]  # no staging left in the volume


@needs_mounts
@pytest.mark.parametrize(
    ("opts", "out", "needle"),
    [("ro", "vol/out", "Read-only file system"), ("ro", "vol", "Read-only file system"),
     ("size=512k", "vol/out", "No space left on device"), ("size=512k", "vol", "No space left on device")],
)  # fmt: skip
def test_read_only_or_full_location_is_one_line_exit_2(tmp_path, opts, out, needle):
    vol = tmp_path / "vol"
    vol.mkdir()
    r = _in_mount_ns(
        f"mount -t tmpfs -o {opts} none {vol} && TRACEDIAG analyze {HEALTHY} -o {tmp_path / out} -q; rc=$?; "
        f"ls -A {vol}; exit $rc",
        tmp_path,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tracediag: error: --out {tmp_path / out}: "), r.stderr
    assert needle in lines[0]
    assert r.stdout.split() == []  # nothing left on the full volume either


def test_staging_is_on_the_file_system_of_out(tmp_path):
    """Without mounts: the staging folder is inside an existing --out (same device, whatever is mounted where)
    and beside a new one; the new one appears whole, by one rename."""
    from tracediag.output import staged_outputs

    seen = {}

    def produce(staging: Path):
        from tracediag.analysis import analyze

        seen["staging"] = staging
        seen["dev"] = staging.stat().st_dev
        return analyze([RANK0], db_path=staging / "trace.duckdb")

    existing = tmp_path / "existing"
    existing.mkdir()
    staged_outputs(existing, produce)
    assert seen["staging"].parent == existing and seen["dev"] == existing.stat().st_dev
    assert sorted(p.name for p in existing.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    new = tmp_path / "a" / "new"
    staged_outputs(new, produce)
    assert seen["staging"].parent == new.parent and seen["dev"] == new.parent.stat().st_dev
    assert sorted(p.name for p in new.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    assert sorted(p.name for p in new.parent.iterdir()) == ["new"]


@pytest.mark.parametrize("name", ["report.html", "findings.json", "trace.duckdb"])
def test_an_output_name_that_is_a_folder_is_one_line_exit_2(tmp_path, name):
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    r = run("analyze", HEALTHY, "-o", out, "-q")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [f"tracediag: error: --out {out}: {name} there is a folder; remove it or choose another --out"]
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_out_that_is_a_file_is_one_line_exit_2(tmp_path):
    out = tmp_path / "out"
    out.write_text("not a folder")
    r = run("analyze", HEALTHY, "-o", out, "-q")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"tracediag: error: --out {out}: is a file, not a folder"
    ]


def _workers_of(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a run's unique --out)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


# `tracediag ...` whose Kineto parser blocks on the file named rank1.pt.trace.json (in a parser process, forked with
# the patched module): a run that stays mid-run until signalled. (A named pipe did this before; inputs that are not
# regular files are now refused before they are opened.)
_BLOCKING_PARSER = """
import sys, threading
import tracediag.ingest.kineto as kineto
real = kineto.parse_kineto
def parse(path, *args, **kwargs):
    if str(path).endswith("rank1.pt.trace.json"):
        threading.Event().wait()
    return real(path, *args, **kwargs)
kineto.parse_kineto = parse
from tracediag.cli import main
sys.argv[0] = "tracediag"
main()
"""


def _blocked_run(tmp_path: Path):
    """A run with two parser processes, one of them blocked in its parser: it stays mid-run until signalled (no
    timing guesses)."""
    import shutil

    blocked = tmp_path / "rank1.pt.trace.json"
    shutil.copyfile(HEALTHY / "rank1.pt.trace.json.gz", blocked)  # a real trace: the content says gzip
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKING_PARSER, "analyze", RANK0, blocked, "-o", out, "-q", "--jobs", "2"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # staging made and both parser processes started
        if any(p.name.endswith(".partial") for p in tmp_path.iterdir()) and len(_workers_of(str(out))) >= 3:
            return proc, out
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the run did not reach its parser processes")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("sig", "code", "word"), [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")])
def test_signal_mid_run_removes_staging_and_workers(tmp_path, sig, code, word):
    import os
    import signal

    proc, out = _blocked_run(tmp_path)
    os.killpg(proc.pid, getattr(signal, sig))  # as a terminal's Ctrl-C or a container stop: the whole group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"tracediag: {word}; no output written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank1.pt.trace.json"]
    assert _workers_of(str(out)) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_takes_the_workers_along_and_the_next_run_cleans_up(tmp_path):
    import os
    import signal
    import time

    proc, out = _blocked_run(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _workers_of(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_of(str(out)) == []  # the parser processes died with their parent
    left = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert len(left) == 1  # kill -9 runs no cleanup: the staging folder stays, unlocked
    r = run("analyze", RANK0, "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "rank1.pt.trace.json"]


def test_a_live_runs_staging_is_left_alone(tmp_path):
    """Two runs writing to one --out: the second does not take the first's staging folder for a stale one."""
    from tracediag.output import _Staging, remove_stale

    out = tmp_path / "out"
    live = _Staging(out)
    try:
        assert remove_stale(out) == [] and live.path.exists()
    finally:
        live.remove()
    legacy = tmp_path / ".out.abcd1234.partial"  # a staging folder of a version without locks
    legacy.mkdir()
    assert remove_stale(out) == []  # could be a run going on: kept for a day
    os_utime_days_ago(legacy, 2)
    assert remove_stale(out) == [legacy]


def os_utime_days_ago(path: Path, days: float) -> None:
    import os
    import time

    t = time.time() - days * 86400
    os.utime(path, (t, t))
