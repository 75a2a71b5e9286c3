"""What each `tracediag mcp` tool does, as plain functions from paths to JSON-ready dicts: the library calls the
CLI makes (analysis.analyze, runs, diff.run_diff, gate.run.run_check), without MCP. Errors are the library's
own TracediagError (a UsageError or InputError naming the input), which the server turns into tool errors.

A *run* is what `analyze` (or `check --out`) wrote: an output folder, its findings.json, or its trace.duckdb. A
Parquet store from `tracediag ingest` is a run too: it is analysed once (into the workspace), not re-parsed.

One call, one run: `analyze` without `out` reserves its run folder (`run-N`, created with exist_ok=False) before
any work, and every answer is built from the call's own in-memory result, never re-read from a shared place, so
concurrent calls never see each other's runs. A workspace `scoped` to a call carries that call's allowed roots
(tracediag.agent.roots: every path argument is resolved and checked) and its cancellation flag
(tracediag.agent.cancel: checked between the pipeline's stages, a DuckDB query interrupted). Every answer is
bounded (`bounded`: MAX_ANSWER_BYTES of JSON; the lists cut short are named in its `truncated`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import math
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracediag.agent.cancel import Cancel
from tracediag.agent.roots import Access, clean_path
from tracediag.errors import InputError, UsageError
from tracediag.findings import WALK_STEPS, coverage_sentence, impact_text
from tracediag.findings import verdict as build_verdict
from tracediag.gate.outcome import finding_id
from tracediag.inputspec import BY_NAME, TP_BOUNDS
from tracediag.interrupt import stopping
from tracediag.request import Request

Progress = Callable[[str], None]

TABLE_ROWS = 20  # rows of a finding's per-rank/per-step table that `explain` returns (the count says how many)
VERDICT_KEYS = ("status", "headline", "rule", "severity", "confidence", "cost", "next_check", "explains")
MAX_ANSWER_BYTES = 1 << 20  # JSON bytes of one tool's answer (query: its rows, readonly_sql.MAX_BYTES)
TP_MAX = TP_BOUNDS[1]  # the --tp bound every entry point checks
KEEP_RUNS = 100  # run-N folders a server keeps in its runs folder by default (tracediag mcp --keep-runs)
_RUN_NAME = re.compile(r"run-(\d+)")
_CUT_STRING = 1000  # characters a string keeps when cutting lists is not enough


def int_arg(name: str, v: object, lo: int, hi: int) -> int | None:
    """An integer argument within [lo, hi] (None stays None); a UsageError naming it otherwise (a float such as
    1e30, a string, a bool are not integers)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise UsageError(f"{name} must be an integer from {lo:,} to {hi:,}, got {_shown(v)}")
    if not lo <= v <= hi:
        raise UsageError(f"{name} must be from {lo:,} to {hi:,}, got {v:,}")
    return v


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"a {type(v).__name__} of {len(text):,} characters"


def bounded(doc: dict[str, Any], cap: int = MAX_ANSWER_BYTES) -> dict[str, Any]:
    """`doc` with `truncated`: the lists cut (halved, the longest first) until its JSON fits in `cap` bytes, each
    named with how many items it had ("findings: 12 of 3,000"); then, if still too big, the longest strings cut."""
    import orjson

    doc = dict(doc)
    doc["truncated"] = []
    cut: dict[str, tuple[int, int]] = {}
    for _ in range(200):
        if len(orjson.dumps(doc)) <= cap:
            break
        found = _largest_list(doc)
        if found is not None:
            path, holder, key, items = found
            keep = len(items) // 2
            holder[key] = items[:keep]
            cut[path] = (keep, cut.get(path, (0, len(items)))[1])
        elif not _cut_longest_string(doc, cut):
            break
    doc["truncated"] = [f"{p}: {k:,} of {n:,}" for p, (k, n) in cut.items()]
    return doc


def _largest_list(doc: dict[str, Any]) -> tuple[str, Any, Any, list] | None:
    """(path, holder, key, list) of the list of 2 or more items with the most JSON bytes in `doc`."""
    import orjson

    best: tuple[int, str, Any, Any, list] | None = None
    todo: list[tuple[Any, str]] = [(doc, "")]
    while todo:
        v, path = todo.pop()
        for k, x in v.items() if isinstance(v, dict) else enumerate(v):
            p = f"{path}.{k}" if path else str(k)
            if isinstance(x, list) and len(x) > 1:
                size = len(orjson.dumps(x))
                if best is None or size > best[0]:
                    best = (size, p, v, k, x)
            if isinstance(x, (dict, list)):
                todo.append((x, p))
    return None if best is None else best[1:]


def _cut_longest_string(doc: dict[str, Any], cut: dict[str, tuple[int, int]]) -> bool:
    """Cut the longest string in `doc` to _CUT_STRING characters; False when none is longer."""
    best: tuple[int, Any, Any, str] | None = None
    todo: list[tuple[Any, str]] = [(doc, "")]
    while todo:
        v, path = todo.pop()
        for k, x in v.items() if isinstance(v, dict) else enumerate(v):
            p = f"{path}.{k}" if path else str(k)
            if isinstance(x, str) and len(x) > _CUT_STRING and (best is None or len(x) > best[0]):
                best = (len(x), v, k, p)
            elif isinstance(x, (dict, list)):
                todo.append((x, p))
    if best is None:
        return False
    n, holder, key, path = best
    holder[key] = holder[key][:_CUT_STRING] + "…"
    cut[f"{path} (characters)"] = (_CUT_STRING, n)
    return True


def jsonable(v: Any) -> Any:
    """A document as strict JSON: a non-finite float (a request rate of inf) as its text, not null."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def summary(doc: dict[str, Any], run: Path, audience: str = "mcp") -> dict[str, Any]:
    """The verdict, the coverage and the ranked findings (id, title, impact) of one run's findings.json; the
    coverage's advice names the inputs as `audience` passes them (the tools' arguments, by default)."""
    v = doc.get("verdict") or build_verdict(doc["checks"])
    cov = v.get("coverage") or {}
    text = coverage_sentence(cov, audience=audience) if "enable" in cov else v.get("coverage_text")
    return {
        "run": str(run),
        "verdict": {k: v.get(k) for k in VERDICT_KEYS},
        "coverage": {
            "rules": cov.get("rules"),
            "ran": cov.get("ran"),
            "could_not_run": cov.get("could_not_run"),
            "text": text,
            "enable": cov.get("enable") or [],
        },
        "findings": [
            {
                "id": finding_id(c),
                "rule": c["rule"],
                "severity": c.get("severity"),
                "title": c["title"],
                "impact": c.get("impact"),
                "cost": impact_text(c),
                "confidence": c.get("confidence"),
                "downstream_of": c.get("downstream_of") or [],
            }
            for c in doc.get("findings") or []
        ],
        "tp": (doc.get("tp") or {}).get("p"),
        "model": (doc.get("model") or {}).get("path"),
    }


class Workspace:
    """The tools over one folder of runs: `analyze` without `out` writes `runs_dir/run-N`; a Parquet store given
    as a run is analysed into it once.

    `access` (tracediag.agent.roots.Access): the roots every path argument must lie in (None: any path, as on
    the command line, where naming a path is consent). `cancel`: the call's cancellation flag. Both are per call:
    `scoped(access, cancel)` is this workspace (its runs and analysed stores shared) for one call. `temporary`:
    the runs folder goes when the server stops, which each run summary says (`kept`, `kept_note`)."""

    def __init__(
        self,
        runs_dir: Path,
        access: Access | None = None,
        cancel: Cancel | None = None,
        temporary: bool = False,
        keep_runs: int = KEEP_RUNS,
    ) -> None:
        self.runs_dir = Path(runs_dir)
        self.temporary = temporary  # the runs folder is removed when the server stops (no --runs-dir)
        self.keep_runs = keep_runs  # run-N folders kept in the runs folder, the oldest removed beyond (0: all)
        self.access = access
        self.cancel = cancel
        self._stores: dict[Path, Path] = {}
        self._store_locks: dict[Path, threading.Lock] = {}
        self._lock = threading.Lock()

    def scoped(self, access: Access | None, cancel: Cancel | None) -> Workspace:
        ws = copy.copy(self)  # the same dicts and locks: one workspace, one call's view of it
        ws.access, ws.cancel = access, cancel
        return ws

    def _new_run_dir(self) -> Path:
        """A new run folder, created now (exist_ok=False): two concurrent calls never get the same one. Beyond
        `keep_runs` runs in the folder, the oldest finished ones go first (an agent's loop must not fill the disk)."""
        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            for n in itertools.count(1):
                p = self.runs_dir / f"run-{n}"
                try:
                    p.mkdir()
                    break
                except FileExistsError:
                    continue
        except OSError as exc:
            raise UsageError(f"cannot create a run folder in {self.runs_dir} ({exc.strerror or exc})") from None
        self._prune_runs(keep=p)
        return p

    def _prune_runs(self, keep: Path) -> None:
        """Remove the oldest finished runs (a run-N folder holding findings.json) beyond `keep_runs`, never `keep`
        nor a folder whose run is still being written (it has no findings.json yet)."""
        if not self.keep_runs:
            return
        runs = sorted((int(m.group(1)), d) for d in self.runs_dir.iterdir()
                      if (m := _RUN_NAME.fullmatch(d.name)) and d.is_dir() and not d.is_symlink())  # fmt: skip
        excess = len(runs) - self.keep_runs
        for _, d in runs:
            if excess <= 0:
                break
            if d != keep and (d / "findings.json").is_file():
                shutil.rmtree(d, ignore_errors=True)
                with self._lock:
                    self._stores = {k: v for k, v in self._stores.items() if v != d}
                excess -= 1

    # --- arguments ----------------------------------------------------------------------------------------
    def _read(self, arg: str, value: str | None) -> Path | None:
        """A read argument as the path to read: resolved and inside the roots when the call has them."""
        if value is None:
            return None
        return self.access.read(arg, value) if self.access else Path(clean_path(arg, value))

    def _write(self, arg: str, value: str | None) -> Path | None:
        """An output argument (`out`): resolved, inside the roots and outside tracediag's checkout (with roots)."""
        if value is None:
            return None
        return self.access.write(arg, value) if self.access else Path(clean_path(arg, value))

    def _inputs(self, inputs: list[str]) -> list[Path]:
        if not isinstance(inputs, list):
            raise UsageError(f"inputs: a list of paths, got {type(inputs).__name__}")
        return [self._read(f"inputs[{i}]", p) for i, p in enumerate(inputs)]

    def _request(self, inputs: list[str], given: dict[str, Any], config: str | None = None) -> Request:
        """The call's inputs as the Request every entry point builds (tracediag.request: the same types, bounds and
        errors), each path resolved and inside the roots first; tracediag.toml from `config`, else found from the
        server's folder up, as `tracediag check` does."""
        read = {}
        for name, v in given.items():
            kind = BY_NAME[name].kind
            if v is None or kind not in ("path", "paths"):
                read[name] = v
            elif kind == "path":
                read[name] = self._read(name, v)
            else:
                items = [v] if isinstance(v, str) else v
                if not isinstance(items, list):
                    raise UsageError(f"{name}: a path or a list of paths, got {type(v).__name__}")
                read[name] = [self._read(f"{name}[{i}]" if len(items) > 1 else name, p) for i, p in enumerate(items)]
        cfg = self._read("config", config) if config is not None else True
        return Request.build(self._inputs(inputs), naming="mcp", config=cfg, **read)

    def _check_cancel(self) -> None:
        if self.cancel is not None:
            self.cancel.check()

    def _say(self, progress: Progress | None) -> Progress:
        """`progress` that first stops the work when the call was cancelled (between the pipeline's stages)."""

        def say(stage: str) -> None:
            self._check_cancel()
            if progress is not None:
                progress(stage)

        return say

    # --- runs -------------------------------------------------------------------------------------------
    def resolve(self, run: str, progress: Progress | None = None) -> tuple[Path, dict[str, Any], Path | None]:
        """(output folder, findings.json document, trace.duckdb or None) of a run given as a path."""
        from tracediag.runs import read_findings
        from tracediag.store.parquet import is_store

        p = self._read("run", run)
        if not p.exists():
            raise InputError(p, "no such file or directory")
        if p.is_dir() and is_store(p):
            p = self._analysed_store(p, progress)
        if p.is_file() and p.suffix == ".duckdb":
            p = p.parent
        folder = p.parent if p.is_file() else p
        findings = p if p.is_file() else p / "findings.json"
        if not findings.is_file():
            raise InputError(
                p, "not a run: no findings.json here (give an analyze or check --out folder; analyze first)"
            )
        db = folder / "trace.duckdb"
        return folder, read_findings(findings), db if db.is_file() else None

    def _analysed_store(self, store: Path, progress: Progress | None) -> Path:
        from tracediag.analysis import analyze
        from tracediag.output import staged_outputs

        key = store.resolve()
        with self._lock:
            lock = self._store_locks.setdefault(key, threading.Lock())
        with lock:  # one analysis per store, however many calls ask for it at once
            if key not in self._stores:
                out = self._new_run_dir()
                try:
                    staged_outputs(out, lambda staging: analyze([], db_path=staging / "trace.duckdb", store=store,
                                                                progress=self._say(progress)))  # fmt: skip
                except BaseException:
                    with contextlib.suppress(OSError):
                        out.rmdir()  # the reserved folder, still empty
                    raise
                self._stores[key] = out
            return self._stores[key]

    # --- the tools --------------------------------------------------------------------------------------
    def analyze(
        self,
        inputs: list[str],
        model: str | None = None,
        out: str | None = None,
        progress: Progress | None = None,
        config: str | None = None,
        **given: Any,
    ) -> dict[str, Any]:
        """Analyse traces and telemetry into `out` (default: a new folder of the workspace), as `tracediag
        analyze` does; the run's verdict, coverage and ranked findings. `given`: the other inputs of a run by
        name (tracediag.inputspec: tp, log, metrics, bench, nccl_tests, topology, slo, …)."""
        import orjson

        from tracediag.analysis import run as run_analysis
        from tracediag.files import OutputGuard
        from tracediag.output import findings_json, staged_outputs

        if out is not None and isinstance(out, str) and not out.strip():
            raise UsageError("out: empty path; give a folder, or leave it out for a new one")
        request = self._request(inputs, {"model": model, **given}, config)
        out_dir = self._write("out", out)
        say = self._say(progress)
        guard = OutputGuard.of(request.read_paths())  # never an input, never a file not ours
        self._check_cancel()
        reserved = out_dir is None
        out_dir = out_dir or self._new_run_dir()
        try:
            with stopping(self.cancel):  # stopped inside a stage too: per chunk, derivation, rule (tracediag.interrupt)
                report = staged_outputs(out_dir, lambda staging: run_analysis(request, staging / "trace.duckdb",
                                                                              progress=say), guard=guard)  # fmt: skip
        except BaseException:
            if reserved:
                with contextlib.suppress(OSError):
                    out_dir.rmdir()  # the reserved folder, still empty: the failed call leaves nothing
            raise
        # this call's own result, not findings.json read back (another call may write the same folder)
        doc = orjson.loads(findings_json(report))
        return bounded(summary(doc, out_dir) | self.kept(out_dir))

    def findings(self, run: str, progress: Progress | None = None) -> dict[str, Any]:
        folder, doc, _ = self.resolve(run, progress)
        return bounded(summary(doc, folder) | self.kept(folder))

    def kept(self, folder: Path) -> dict[str, Any]:
        """Whether the run `folder` outlives the server (`kept`), and where it is and for how long (`kept_note`)."""
        runs = self.runs_dir.resolve()
        inside = folder.resolve().is_relative_to(runs)
        cap = f"; the folder keeps the last {self.keep_runs} runs (--keep-runs)" if self.keep_runs else ""
        if inside and self.temporary:
            return {"kept": False, "kept_note": f"temporary: {folder} is in the server's temporary runs folder {runs}, "
                    "removed when the server stops; pass `out` to keep a run, or start the server with "
                    f"`tracediag mcp --runs-dir DIR`{cap}"}  # fmt: skip
        if inside:
            return {"kept": True, "kept_note": f"kept: {folder} is in the runs folder {runs} (--runs-dir){cap}"}
        return {"kept": True, "kept_note": f"kept: {folder} (the folder given, not removed by the server)"}

    def explain(self, run: str, rule: str) -> dict[str, Any]:
        """One rule's outcome on a run: its status, formula, values plugged in, evidence events, next check."""
        from tracediag.engine import load_rules

        folder, doc, _ = self.resolve(run)
        if not isinstance(rule, str) or len(rule) > 200:
            raise UsageError("explain: rule must be a rule id such as COL002 or a finding id")
        want = rule.strip().upper()
        matches = [c for c in doc["checks"] if want in (c["rule"].upper(), finding_id(c).upper())]
        if not matches:
            known = ", ".join(sorted({c["rule"] for c in doc["checks"]}))
            raise UsageError(f"explain: no rule '{rule}' in {folder} (rules: {known})")
        c = matches[0]
        module = next((m for m in load_rules() if m.RULE.id == c["rule"]), None)
        table = c.get("table") or []
        return bounded({
            "run": str(folder),
            "id": finding_id(c),
            "rule": c["rule"],
            "status": c["status"],
            "title": c["title"],
            "step": c.get("step"),
            "walk_step": WALK_STEPS.get(c.get("step")),
            "rule_title": module.RULE.title if module else None,
            "severity": c.get("severity"),
            "confidence": c.get("confidence"),
            "impact": c.get("impact"),
            "cost": impact_text(c) if c["status"] == "finding" else None,
            "formula": c.get("formula"),
            "substituted": c.get("substituted"),
            "values": c.get("values") or {},
            "evidence": c.get("evidence") or [],
            "next_check": c.get("next_check"),
            "reason": c.get("reason"),
            "downstream_of": c.get("downstream_of") or [],
            "table": table[:TABLE_ROWS],
            "table_rows": len(table),
            "also": [finding_id(x) for x in matches[1:]],
            "about": (module.__doc__ or "").strip() if module else None,
        })  # fmt: skip

    def query(
        self,
        run: str,
        sql: str,
        max_rows: int | None = None,
        time_limit_s: float | None = None,
        max_bytes: int | None = None,
    ) -> dict:
        """One read-only SELECT over the run's trace.duckdb (readonly_sql), within its row, byte, memory and time
        bounds; interrupted when the call is cancelled."""
        from tracediag.agent.readonly_sql import MAX_BYTES, MAX_ROWS, ROW_CAP, TIME_LIMIT_S, read_only_query

        max_rows = int_arg("query: max_rows", max_rows, 1, ROW_CAP)
        max_bytes = int_arg("query: max_bytes", max_bytes, 1024, MAX_BYTES)
        if not isinstance(sql, str):
            raise UsageError("query: sql must be one SELECT statement as a string")
        folder, _, db = self.resolve(run)
        if db is None:
            raise InputError(folder, "no trace.duckdb beside findings.json: nothing to query")
        res = read_only_query(
            db,
            sql,
            MAX_ROWS if max_rows is None else max_rows,
            TIME_LIMIT_S if time_limit_s is None else time_limit_s,
            MAX_BYTES if max_bytes is None else max_bytes,
            cancel=self.cancel,
        )
        return {"run": str(folder)} | res

    def diff(
        self,
        before: str,
        after: str,
        model: str | None = None,
        force_compare: bool = False,
        out: str | None = None,
    ) -> dict[str, Any]:
        """`tracediag diff` of two runs (output folders, findings.json, traces or stores): the comparability
        verdict with both fingerprints, and — when comparable or forced — what changed."""
        from tracediag.diff import run_diff

        b, a, m = self._read("before", before), self._read("after", after), self._read("model", model)
        out_dir = self._write("out", out)
        self._check_cancel()
        d = run_diff(b, a, before_model=m, after_model=m, out=out_dir, force_compare=bool(force_compare))
        return bounded(jsonable(d | {"out": None if out_dir is None else str(out_dir)}))

    def check(
        self,
        inputs: list[str],
        model: str | None = None,
        fail_on: str | None = None,
        baseline: str | None = None,
        rules: str | None = None,
        require: str | None = None,
        config: str | None = None,
        out: str | None = None,
        progress: Progress | None = None,
        **given: Any,
    ) -> dict[str, Any]:
        """The gate as `tracediag check` gives it: outcome (passed / failed / inconclusive), its exit status,
        the judged items that are not plain passes, and the command's own text. `given`: the other inputs of a
        run by name, as `analyze` takes them."""
        from tracediag.gate.run import run_check
        from tracediag.gate.text import print_result

        request = self._request(inputs, {"model": model, **given}, config)
        baseline_path, out_dir = self._read("baseline", baseline), self._write("out", out)
        say = self._say(progress)
        self._check_cancel()
        with stopping(self.cancel):
            result, warnings = run_check(request, fail_on=fail_on, baseline=baseline_path, rules=rules,
                                         require=require, out=out_dir, progress=say)  # fmt: skip
        out_text = None if out_dir is None else str(out_dir)
        text = io.StringIO()
        print_result(result, file=text, out=out_text, audience="mcp")
        d = result.to_dict()
        return bounded({
            "outcome": result.outcome,
            "exit_code": result.exit_code,
            "fail_on": result.fail_on,
            "inconclusive": d["inconclusive"],
            "counts": d["counts"],
            "coverage": d["coverage"],
            "verdict": {k: result.doc["verdict"].get(k) for k in VERDICT_KEYS},
            # the items that are not plain passes, without the full finding (explain gives that)
            "outcomes": [
                {k: v for k, v in o.to_dict().items() if k != "check"} for o in result.outcomes if o.status != "pass"
            ],
            "warnings": warnings,
            "text": text.getvalue(),
            "out": out_text,
        })  # fmt: skip
