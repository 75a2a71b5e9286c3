"""Mutations of what surrounds the inputs rather than their bytes: command lines, tracediag's own outputs read
back, and file-system faults at the output paths.

Each case is a workspace of real files (a sample trace, its config, a real vLLM log, a run folder and a Parquet
store that tracediag wrote) and one `tracediag` command line drawn from `rnd`. The contract (`check_case`):
- exit 0, 1, 2 or 4 (`check`'s inconclusive), never 3 and never a hang;
- exit 2 is one line on stderr;
- no file of the user's changed (every file of the workspace that the command was not told to write keeps its
  bytes), and no staging folder (`*.partial`) is left anywhere in the workspace.

Kinds: `command-line` (options and values drawn from every option of analyze/check/diff/ingest, values hostile or
valid, output paths aimed at inputs), `read-back` (a run folder, findings.json, trace.duckdb, store or baseline
damaged, then diff / check --baseline / analyze --store), `fs-fault` (output paths under a file, through a dangling
symlink or a loop, a name too long, a FIFO or a device as the output, a folder where an output file goes),
`store-tamper` (a store's layout or a file's schema edited: a column dropped, retyped or added, files and partitions
added, removed or swapped, a rank=abc folder, a link, a FIFO, a file that is not Parquet; then analyze / check /
diff --store). `mcp-arguments` (the MCP server's tools given hostile arguments and malformed JSON-RPC frames) and
`scrape` (`tracediag scrape` against a hostile /metrics server) are tests/fuzz/services.py's, with their own
contracts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fuzz import harness

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "healthy_tp1"
LOG = REPO / "tests" / "data" / "external" / "vllm" / "log_excerpts" / "vllm-6689_v0_healthy_idle.log"

KINDS = ("command-line", "read-back", "fs-fault", "store-tamper", "mcp-arguments", "scrape")
EXIT_OK = (0, 1, 2, 4)


@cache
def _built(root: str) -> tuple[Path, Path]:
    """A run folder and a store that tracediag wrote from the sample (made once per process)."""
    base = Path(root)
    run_dir, store = base / "run", base / "store"
    if not (run_dir / "findings.json").exists():
        trace = SAMPLE / "rank0.pt.trace.json.gz"
        for args in (["analyze", trace, "-m", SAMPLE / "config.json", "-o", run_dir, "-q"],
                     ["ingest", trace, "--store", store, "-q"]):  # fmt: skip
            subprocess.run([sys.executable, "-m", "tracediag", *map(str, args)], check=True, capture_output=True)
    return run_dir, store


def workspace(work: Path, cache_dir: Path) -> dict[str, Path]:
    """The user's files for one case, copied fresh into `work/user`."""
    run_dir, store = _built(str(cache_dir))
    user = work / "user"
    user.mkdir(parents=True)
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", user / "rank0.pt.trace.json.gz")
    shutil.copy(SAMPLE / "config.json", user / "config.json")
    shutil.copy(LOG, user / "server.log")
    shutil.copytree(run_dir, user / "run")
    shutil.copytree(store, user / "store")
    (user / "notes.txt").write_text("the user's own notes\n")
    return {
        "trace": user / "rank0.pt.trace.json.gz",
        "config": user / "config.json",
        "log": user / "server.log",
        "run": user / "run",
        "findings": user / "run" / "findings.json",
        "db": user / "run" / "trace.duckdb",
        "store": user / "store",
        "notes": user / "notes.txt",
        "folder": user,
    }


HOSTILE_NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e400", "99999999999999999999", "abc", "", " ", "2.5", "0x10"]
HOSTILE_TEXT = ["", " ", "ttft=nan", "ttft=-1", "ttft=500,", "=,=", "x" * 5000, "ttft=500;tpot=50", "\x00", "é"]


def _output_target(rnd: random.Random, ws: dict[str, Path], work: Path) -> str:
    """Where an output option points: mostly at something of the user's, sometimes somewhere new."""
    return str(rnd.choice([ws["trace"], ws["config"], ws["log"], ws["notes"], ws["findings"], ws["db"], ws["folder"],
                           ws["run"], work / "new-out", work / "new.xml", ""]))  # fmt: skip


def command_line(rnd: random.Random, ws: dict[str, Path], work: Path) -> list[str]:
    command = rnd.choice(["analyze", "check", "diff", "ingest"])
    trace = str(ws["trace"])
    if command == "diff":
        args = ["diff", rnd.choice([trace, str(ws["run"]), str(ws["findings"])]), rnd.choice([trace, str(ws["run"])])]
    else:
        args = [command, rnd.choice([trace, str(ws["folder"]), trace])]
    options = {
        "analyze": ["-o", "-m", "--tp", "--jobs", "--hbm-bandwidth", "--peak-tflops", "--slo", "--log",
                    "--memory-limit", "--ranks", "--force", "--tp1-baseline"],
        "check": ["-o", "-m", "--tp", "--junit", "--annotated-trace", "--baseline", "--rules", "--require",
                  "--fail-on", "--log", "--force", "--jobs"],
        "diff": ["-o", "-m", "--tp", "--jobs", "--force"],
        "ingest": ["--store", "--jobs", "--log", "--memory-limit"],
    }[command]  # fmt: skip
    for opt in rnd.sample(options, rnd.randint(1, min(4, len(options)))):
        if opt == "--force":
            args.append(opt)
        elif opt in ("-o", "--junit", "--annotated-trace", "--store"):
            args += [opt, _output_target(rnd, ws, work)]
        elif opt in ("-m", "--log", "--tp1-baseline", "--baseline"):
            args += [opt, str(rnd.choice([ws["config"], ws["log"], ws["trace"], ws["findings"], ws["folder"],
                                          work / "missing.json"]))]  # fmt: skip
        elif opt in ("--slo", "--rules", "--require", "--ranks", "--fail-on", "--memory-limit"):
            args += [opt, rnd.choice([*HOSTILE_TEXT, "COL*", "0", "all", "warning", "1GiB", "ttft=500,tpot=50"])]
        else:
            args += [opt, rnd.choice([*HOSTILE_NUMBERS, "1", "2"])]
    # every command writes somewhere in the case's own folder: a default output folder would land in the current
    # folder (the checkout, under pytest)
    if "-o" not in args and "--store" not in args:
        args += ["-o" if command != "ingest" else "--store", str(work / "new-out")]
    if "-q" not in args:
        args.append("-q")
    return args


def _damage_json(rnd: random.Random, path: Path) -> None:
    """Replace 1-3 values at random depths with values of other types."""
    doc = json.loads(path.read_text())
    for _ in range(rnd.randint(1, 3)):
        parent, key = None, None
        node = doc
        for _depth in range(rnd.randint(1, 5)):
            keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
            if not keys:
                break
            parent, key = node, rnd.choice(keys)
            node = parent[key]
            if not isinstance(node, (dict, list)) or rnd.random() < 0.3:
                break
        if parent is not None:
            parent[key] = rnd.choice([None, 0, -1, 1e308, "text", [], {}, [1, "a"], {"x": 1}, True, 2**70])
    path.write_text(json.dumps(doc))


def _damage_bytes(rnd: random.Random, path: Path) -> None:
    data = bytearray(path.read_bytes())
    how = rnd.choice(["truncate", "flip", "zero"])
    if how == "truncate":
        del data[rnd.randrange(len(data)) :]
    elif how == "flip":
        for _ in range(rnd.randint(1, 16)):
            data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
    else:
        start = rnd.randrange(len(data))
        data[start : start + rnd.randint(1, 4096)] = bytes(min(4096, len(data) - start))
    path.write_bytes(bytes(data))


def read_back(rnd: random.Random, ws: dict[str, Path], work: Path) -> list[str]:
    target = rnd.choice(["findings", "db", "parquet", "manifest"])
    if target == "findings":
        (_damage_json if rnd.random() < 0.7 else _damage_bytes)(rnd, ws["findings"])
    elif target == "db":
        _damage_bytes(rnd, ws["db"])
    elif target == "parquet":
        _damage_bytes(rnd, rnd.choice(sorted((ws["store"] / "tables").rglob("*.parquet"))))
    else:
        _damage_json(rnd, ws["store"] / "manifest.json")
    trace, out = str(ws["trace"]), str(work / "new-out")
    return rnd.choice([
        ["diff", str(ws["run"]), trace, "-o", out, "-q"],
        ["diff", str(ws["findings"]), str(ws["run"]), "-o", out, "-q"],
        ["check", trace, "-m", str(ws["config"]), "--baseline", str(rnd.choice([ws["run"], ws["findings"]])), "-q"],
        ["analyze", "--store", str(ws["store"]), "-o", out, "-q"],
        ["check", "--store", str(ws["store"]), "-q"],
        ["diff", str(ws["store"]), str(ws["run"]), "-o", out, "-q"],
    ])  # fmt: skip


def fs_fault(rnd: random.Random, ws: dict[str, Path], work: Path) -> list[str]:
    fault = rnd.choice(["under-a-file", "dangling-link", "link-loop", "long-name", "fifo", "device", "folder-in-way"])
    if fault == "under-a-file":
        target = ws["notes"] / "out"
    elif fault == "dangling-link":
        target = work / "dangling"
        target.symlink_to(work / "nowhere" / "x")
    elif fault == "link-loop":
        target = work / "loop"
        target.symlink_to(target)
    elif fault == "long-name":
        target = work / ("n" * 300)
    elif fault == "fifo":
        target = work / "pipe"
        os.mkfifo(target)
    elif fault == "device":
        # a character device of the case's own (as /dev/null is: the same major and minor), never the system's:
        # a regression that renamed onto it would replace only this node
        target = work / "null"
        if os.geteuid() == 0:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        else:
            os.mkfifo(target)
    else:
        target = work / "o"
        (target / rnd.choice(["report.html", "findings.json", "trace.duckdb", "diff.json"])).mkdir(parents=True)
    trace, cfg = str(ws["trace"]), str(ws["config"])
    return rnd.choice([
        ["analyze", trace, "-o", str(target), "-q"],
        ["check", trace, "-m", cfg, "--junit", str(target), "-q"],
        ["check", trace, "-m", cfg, "--annotated-trace", str(target), "-q"],
        ["check", trace, "-m", cfg, "-o", str(target), "-q"],
        ["diff", trace, trace, "-o", str(target), "-q"],
        ["ingest", trace, "--store", str(target), "-q"],
    ])  # fmt: skip


def _tamper_parquet(rnd: random.Random, store: Path) -> None:
    """One edit of a store's layout or a file's schema, as a person or a script would make it after the ingest."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = sorted(p for p in (store / "tables").rglob("*.parquet") if p.is_file() and not p.is_symlink())
    f = rnd.choice(files)
    edit = rnd.choice(
        [
            "drop-column",
            "as-text",
            "as-list",
            "add-column",
            "copy-file",
            "copy-partition",
            "junk-rank",
            "text-file",
            "link-out",
            "fifo",
            "remove-file",
            "other-table-file",
            "empty-table-folder",
        ]
    )
    t = pq.read_table(f, partitioning=None)
    col = rnd.choice(t.column_names)
    if edit == "drop-column":
        pq.write_table(t.drop([col]), f)
    elif edit == "as-text" and not pa.types.is_nested(t.schema.field(col).type):
        pq.write_table(t.set_column(t.schema.get_field_index(col), col, pc.cast(t[col], pa.string(), safe=False)), f)
    elif edit == "as-list":
        pq.write_table(t.set_column(t.schema.get_field_index(col), col, pa.array([[1]] * t.num_rows)), f)
    elif edit == "add-column":
        pq.write_table(t.append_column(f"x{rnd.randrange(99)}", pa.array([None] * t.num_rows, pa.int64())), f)
    elif edit == "copy-file":
        pq.write_table(t.slice(0, rnd.randrange(t.num_rows + 1)), f.with_name("extra-0.parquet"))
    elif edit == "copy-partition" and f.parent.name.startswith("rank="):
        shutil.copytree(f.parent, f.parent.with_name(f"rank={rnd.choice([1, 7, -1, 2**31 - 1])}"), dirs_exist_ok=True)
    elif edit == "junk-rank" and f.parent.name.startswith("rank="):
        shutil.copytree(f.parent, f.parent.with_name(rnd.choice(["rank=abc", "rank=", "rank=1e400", "rank=0x1"])))
    elif edit == "text-file":
        f.with_name(rnd.choice(["notes.txt", "x.parquet.tmp", "_SUCCESS"])).write_text("x")
    elif edit == "link-out":
        f.with_name("l.parquet").symlink_to(rnd.choice(["/etc/hostname", "/dev/zero", str(files[0])]))
    elif edit == "fifo":
        os.mkfifo(f.with_name("p.parquet"))
    elif edit == "remove-file":
        f.unlink()
    elif edit == "other-table-file" and len(files) > 1:
        shutil.copy(rnd.choice([g for g in files if g != f]), f)
    elif edit == "empty-table-folder":
        (store / "tables" / rnd.choice(["kernels", "nope", "steps"])).mkdir(exist_ok=True)


def store_tamper(rnd: random.Random, ws: dict[str, Path], work: Path) -> list[str]:
    for _ in range(rnd.choice([1, 1, 2])):
        _tamper_parquet(rnd, ws["store"])
    out = str(work / "new-out")
    return rnd.choice([
        ["analyze", "--store", str(ws["store"]), "-o", out, "-q"],
        ["check", "--store", str(ws["store"]), "-q"],
        ["diff", str(ws["store"]), str(ws["run"]), "-o", out, "-q"],
    ])  # fmt: skip


MAKERS = {"command-line": command_line, "read-back": read_back, "fs-fault": fs_fault, "store-tamper": store_tamper}


def _digests(folder: Path) -> dict[str, str]:
    out = {}
    for root, _dirs, names in os.walk(folder):
        for n in names:
            p = Path(root, n)
            if p.is_file() and not p.is_symlink():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@dataclass(frozen=True)
class Case:
    args: list[str]
    work: Path
    kind: str = ""  # which of KINDS made it (mcp-arguments and scrape are judged by tests/fuzz/services.py)


def make_case(kind: str, rnd: random.Random, work: Path, cache_dir: Path) -> Case:
    ws = workspace(work, cache_dir)
    if kind == "mcp-arguments":
        from fuzz import services

        services.mcp_workspace(ws, work)
        return Case(services.mcp_frames(rnd, ws, work), work, kind)
    if kind == "scrape":
        from fuzz import services

        return Case([services.scrape_case(rnd, ws, work)], work, kind)
    return Case(MAKERS[kind](rnd, ws, work), work, kind)


OUTPUT_FILES = {"-o": ("findings.json", "report.html", "trace.duckdb", "check.json", "diff.json", "diff.html"),
                "--out": ("findings.json", "report.html", "trace.duckdb", "check.json", "diff.json", "diff.html"),
                "--junit": None, "--annotated-trace": None}  # fmt: skip
INPUT_OPTIONS = ("-m", "--model", "--log", "--baseline", "--tp1-baseline", "--config")


def _may_write(args: list[str]) -> set[str]:
    """Files the command line lets tracediag replace: its outputs' paths that are not inputs. A file among them
    may change only when tracediag wrote it or --force was given (both judged by the guard itself, so the
    contract here is the weaker one: never an input, never a file outside the outputs)."""
    inputs: set[str] = set()
    outputs: set[str] = set()
    positional = True
    i = 1
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            positional = False
            if a in OUTPUT_FILES and i + 1 < len(args):
                target = Path(args[i + 1])
                names = OUTPUT_FILES[a]
                outputs |= {str(target / n) for n in names} if names else {str(target)}
                i += 2
                continue
            if a in INPUT_OPTIONS and i + 1 < len(args):
                inputs.add(args[i + 1])
                i += 2
                continue
        elif positional:
            inputs.add(a)
        i += 1
    if "--store" in args and args[0] == "ingest":  # the store replaces its own tables and manifest
        store = Path(args[args.index("--store") + 1])
        with contextlib.suppress(OSError):  # a name too long, a loop: nothing there to replace
            outputs |= {str(p) for p in store.rglob("*")} if store.is_dir() else set()
    resolved = {os.path.realpath(p) for p in inputs}
    return {p for p in outputs if os.path.realpath(p) not in resolved}


def check_case(case: Case, seconds: float = 120.0) -> harness.Outcome:
    """Run the case's command line and judge it by the contract in the module docstring."""
    if case.kind in ("mcp-arguments", "scrape"):
        from fuzz import services

        return (services.check_mcp if case.kind == "mcp-arguments" else services.check_scrape)(case, seconds)
    user = case.work / "user"
    allowed = _may_write(case.args)
    before = _digests(user)
    status, err = harness.run_cli(case.args, seconds)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    shown = " ".join(case.args)[:200]
    if status is None:
        return harness.Outcome("hang", f"tracediag {shown} still running after {seconds} s")
    if status not in EXIT_OK:
        return harness.Outcome("internal", f"exit {status} of tracediag {shown}: {' | '.join(lines)[-300:]}", "cli")
    if status == 2 and len(lines) != 1:
        return harness.Outcome("bad_error", f"exit 2 with {len(lines)} lines: {' | '.join(lines)[:300]}")
    after = _digests(user)
    changed = sorted(p for p, h in before.items() if after.get(p) != h and p not in allowed)
    if changed:
        return harness.Outcome("partial", f"tracediag {shown} changed or removed the user's {changed[:3]}")
    staging = [str(p) for p in case.work.rglob("*.partial")]
    if staging:
        return harness.Outcome("partial", f"tracediag {shown} left staging {staging[:2]}")
    return harness.Outcome("input_error" if status == 2 else "ok", lines[0][:300] if lines else "")
