"""`tracediag check` as a library: config file, rule selection, expectations, baselines, key measures.

A check run is the same analysis as `analyze`, judged:

- **rules**: every selected rule is one outcome; a finding at or above `fail_on` fails the check unless
  the baseline already had it (same identity, no worse);
- **expectations**: facts of the run or values of a rule compared with what the config expects
  (`expected_tp`, `expected_attention_family`, `[[expect]]` entries); absolute, not baseline-relative;
- **baseline measures**: key measures of the run (step time per phase and T bucket, communication
  share, attention share, collectives per step, payload per call) compared with the baseline's; a
  regression beyond its tolerance is a finding (rule id `BASELINE`) with both values and the change.

Identity of a finding across runs is its rule id plus `values["key"]` when a rule reports several
findings (BASELINE and EXPECT do: "BASELINE:step_time[decode,T=2]"), never the title wording.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import re
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson

from tracediag.engine import Context, Settings
from tracediag.errors import InputError, UsageError
from tracediag.findings import SEVERITY_ORDER, Check

FAIL_ON_LEVELS = ("info", "warning", "error")
CHECK_SCHEMA_ID = "tracediag/check-v1"
FINDINGS_SCHEMA_PREFIX = "tracediag/findings-"
BASELINE_RULE = "BASELINE"
EXPECT_RULE = "EXPECT"
WHOLE_TRACE = "whole trace (no step markers)"  # steps.marker_source of the fallback step (derive/steps.sql)

# ---------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Tolerances:
    """How much a key measure may grow over the baseline before it is a regression."""

    step_time: float = 0.10  # relative: median step time per phase and T bucket may grow by 10 %
    communication_share: float = 0.05  # absolute: share of step time in collectives, +5 points
    attention_share: float = 0.05  # absolute: share of step time in attention, +5 points
    collectives_per_step: float = 0.5  # absolute: median calls per step (so one extra call fails)
    payload_per_call: float = 0.10  # relative: mean payload bytes per call of a collective op
    impact: float = 0.10  # absolute: a known finding whose impact (0-1) grew by more is "worsened"


TOLERANCE_MEANING = {
    "step_time": "relative growth of the median step time per phase and T bucket",
    "communication_share": "absolute growth of the share of step time spent in collectives",
    "attention_share": "absolute growth of the share of step time spent in attention",
    "collectives_per_step": "absolute growth of the median collective calls per step (per phase and op)",
    "payload_per_call": "relative growth of the mean payload bytes per call (per collective op)",
    "impact": "absolute growth of a known finding's impact (0-1) that makes it 'worsened'",
}


@dataclass(frozen=True)
class Expectation:
    """A fact of the run or a rule's value compared with what the config expects."""

    rule: str  # rule id whose `values` hold the value, or "run" for facts of the run (tp, attention_family)
    value: str  # dotted path into the values / facts, e.g. "tp", "attention_family.decode", "e_a"
    equals: Any = None
    one_of: tuple[Any, ...] = ()
    min: float | None = None
    max: float | None = None
    severity: str = "error"
    name: str | None = None  # shown in reports; default "<rule>.<value>"
    source: str = "[[expect]]"  # config key it came from

    @property
    def key(self) -> str:
        return f"{self.rule}.{self.value}"

    def describe(self) -> str:
        parts = []
        if self.equals is not None:
            parts.append(f"= {self.equals!r}")
        if self.one_of:
            parts.append(f"in {list(self.one_of)!r}")
        if self.min is not None:
            parts.append(f"≥ {self.min:g}")
        if self.max is not None:
            parts.append(f"≤ {self.max:g}")
        return f"{self.name or self.key} {' and '.join(parts)}"


@dataclass(frozen=True)
class CheckConfig:
    """Settings of a check run; see `CONFIG_KEYS` for the file keys and their defaults."""

    path: Path | None = None  # the file it was read from (None: defaults)
    rules: tuple[str, ...] = ()  # rule id globs; empty: every rule
    fail_on: str = "warning"
    settings: Settings = field(default_factory=Settings)
    expected_tp: int | None = None
    expected_attention_family: tuple[tuple[str, str], ...] = ()  # (phase or "any", catalog family)
    regression_severity: str = "warning"
    tolerances: Tolerances = field(default_factory=Tolerances)
    expectations: tuple[Expectation, ...] = ()

    def all_expectations(self) -> list[Expectation]:
        out = []
        if self.expected_tp is not None:
            out.append(Expectation("run", "tp", equals=self.expected_tp, name="TP degree", source="expected_tp"))
        for phase, fam in self.expected_attention_family:
            path = "attention_family" if phase == "any" else f"attention_family.{phase}"
            label = "attention family" + ("" if phase == "any" else f" ({phase})")
            out.append(Expectation("run", path, equals=fam, name=label, source="expected_attention_family"))
        return out + list(self.expectations)


# Keys of the config that are not engine Settings fields: key -> (default as documented, meaning).
CHECK_KEYS: dict[str, tuple[str, str]] = {
    "rules": ("all rules", 'rule ids or globs to run, e.g. `["COL*", "SHP001"]` or `"COL*,SHP001"`'),
    "fail_on": ('"warning"', "lowest severity that fails the check: info, warning or error"),
    "expected_tp": ("none", "tensor-parallel degree the deployment must run with"),
    "expected_attention_family": (
        "none",
        'attention kernel family (catalog name, e.g. "fa2", "fa3", "flashinfer"), or a table per '
        'phase: `{prefill = "fa3", decode = "flashinfer"}`',
    ),
    "regression_severity": ('"warning"', "severity of a baseline regression finding"),
    "tolerances": ("see below", "table of baseline tolerances"),
    "expect": ("none", "array of tables `{rule, value, equals / one_of / min / max, severity, name}`"),
}
SETTINGS_MEANING = {
    "collective_count_slack": "COL001: all-reduces beyond 2L still counted as ≈ 2L",
    "payload_tolerance": "COL002: a payload ratio within 1 ± this is a match",
    "max_evidence": "example events kept per finding",
    "hbm_bandwidth_gbs": "GPU memory bandwidth, GB/s",
    "peak_tflops": "GPU dense peak for the activation dtype, TFLOP/s",
    "slo": 'latency budgets in ms: a table `{ttft = 500, tpot = 50}` or `"ttft=500,tpot=50"`',
    "tp1_baseline": "a TP=1 trace of the same model",
}
_SETTINGS_ALIASES = {"slo": "slo_ms"}  # config key -> Settings field
_EXPECT_KEYS = ("rule", "value", "equals", "one_of", "min", "max", "severity", "name")
_RULE_GLOB = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")


def settings_keys() -> dict[str, str]:
    """Config key -> Settings field, for every field of tracediag.engine.Settings."""
    inverse = {v: k for k, v in _SETTINGS_ALIASES.items()}
    return {inverse.get(f.name, f.name): f.name for f in dataclasses.fields(Settings)}


def config_reference() -> list[tuple[str, str, str]]:
    """(key, default, meaning) for every config key, in the order the README documents them."""
    rows = [(k, d, m) for k, (d, m) in CHECK_KEYS.items()]
    defaults = Settings()
    for key, fname in settings_keys().items():
        if key in CHECK_KEYS:
            continue
        default = getattr(defaults, fname)
        shown = "none" if default in (None, ()) else repr(default)
        rows.append((key, shown, SETTINGS_MEANING.get(key, "engine setting (tracediag.engine.Settings)")))
    tol = Tolerances()
    for f in dataclasses.fields(Tolerances):
        rows.append((f"tolerances.{f.name}", f"{getattr(tol, f.name):g}", TOLERANCE_MEANING[f.name]))
    return rows


def find_config(start: Path | None = None) -> Path | None:
    """tracediag.toml, else a pyproject.toml with [tool.tracediag], from `start` up to the project root.

    The search stops at the first folder holding pyproject.toml or .git (the project root).
    """
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "tracediag.toml").is_file():
            return d / "tracediag.toml"
        py = d / "pyproject.toml"
        if py.is_file():
            return py if _read_toml(py).get("tool", {}).get("tracediag") is not None else None
        if (d / ".git").exists():
            return None
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML ({exc})") from None
    except OSError as exc:
        raise InputError(path, f"cannot read file ({exc.strerror or exc})") from None


def _unknown_key(path: Path, where: str, key: str, known: list[str]) -> InputError:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return InputError(path, f"unknown key '{key}' in {where}{hint} (known keys: {', '.join(sorted(known))})")


def _number(path: Path, key: str, v: Any, *, integer: bool = False, minimum: float = 0.0) -> float | int:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or v < minimum:
        kind = "an integer" if integer else "a number"
        raise InputError(path, f"'{key}' must be {kind} ≥ {minimum:g}, got {v!r}")
    return v if integer else float(v)


def _severity(path: Path, key: str, v: Any) -> str:
    if v not in FAIL_ON_LEVELS:
        raise InputError(path, f"'{key}' must be one of {', '.join(FAIL_ON_LEVELS)}, got {v!r}")
    return v


def parse_rule_globs(v: Any) -> tuple[str, ...] | None:
    """'COL*,SHP001' or ["COL*", "SHP001"] -> ("COL*", "SHP001"); None when it is not rule ids or globs."""
    items = [s.strip() for s in v.split(",")] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and _RULE_GLOB.match(s) for s in items if s):
        return None
    return tuple(s.upper() for s in items if s)


def attention_families() -> set[str]:
    from tracediag.catalog import load_patterns

    return {p.family for p in load_patterns() if p.klass in ("attention", "attention_fallback")}


def _settings_value(path: Path, key: str, fname: str, v: Any) -> Any:
    """Coerce a config value to the type of the Settings field (read from its annotation)."""
    ftype = str(next(f.type for f in dataclasses.fields(Settings) if f.name == fname))
    if fname == "slo_ms":
        from tracediag.cli import SLO_KEYS, parse_slo

        if isinstance(v, str):
            try:
                return parse_slo(v)
            except UsageError as exc:
                raise InputError(path, f"'{key}': {exc}".replace("--slo: ", "")) from None
        if not isinstance(v, dict):
            raise InputError(path, f"'{key}' must be a table such as {{ttft = 500, tpot = 50}}, got {v!r}")
        out = []
        for k, ms in v.items():
            if k not in SLO_KEYS:
                raise _unknown_key(path, f"'{key}'", k, list(SLO_KEYS))
            out.append((k, float(_number(path, f"{key}.{k}", ms, minimum=1e-9))))
        return tuple(out)
    base = ftype.replace(" ", "").split("|")[0]
    if base == "int":
        return _number(path, key, v, integer=True)
    if base == "float":
        return _number(path, key, v)
    if base == "str":
        if not isinstance(v, str):
            raise InputError(path, f"'{key}' must be a string, got {v!r}")
        return v
    if base == "bool":
        if not isinstance(v, bool):
            raise InputError(path, f"'{key}' must be true or false, got {v!r}")
        return v
    return tuple(v) if isinstance(v, list) else v


def _expect_entry(path: Path, i: int, e: Any) -> Expectation:
    where = f"[[expect]] entry {i + 1}"
    if not isinstance(e, dict):
        raise InputError(path, f"{where} must be a table, got {e!r}")
    for k in e:
        if k not in _EXPECT_KEYS:
            raise _unknown_key(path, where, k, list(_EXPECT_KEYS))
    for k in ("rule", "value"):
        if not isinstance(e.get(k), str) or not e[k]:
            raise InputError(path, f"{where}: '{k}' is required (a string)")
    if not any(k in e for k in ("equals", "one_of", "min", "max")):
        raise InputError(path, f"{where}: give one of 'equals', 'one_of', 'min', 'max'")
    one_of = e.get("one_of", [])
    if not isinstance(one_of, list):
        raise InputError(path, f"{where}: 'one_of' must be an array, got {one_of!r}")
    return Expectation(
        rule="run" if e["rule"].lower() == "run" else e["rule"].upper(),
        value=e["value"],
        equals=e.get("equals"),
        one_of=tuple(one_of),
        min=_number(path, f"{where}.min", e["min"], minimum=float("-inf")) if "min" in e else None,
        max=_number(path, f"{where}.max", e["max"], minimum=float("-inf")) if "max" in e else None,
        severity=_severity(path, f"{where}.severity", e.get("severity", "error")),
        name=e.get("name"),
    )


def parse_config(table: dict[str, Any], path: Path, where: str) -> CheckConfig:
    """Validate one config table; every wrong key or value is an InputError naming it."""
    skeys = settings_keys()
    known = sorted({*CHECK_KEYS, *skeys})
    kw: dict[str, Any] = {"path": path}
    settings_kw: dict[str, Any] = {}
    for key, v in table.items():
        if key == "rules":
            kw["rules"] = parse_rule_globs(v)
            if kw["rules"] is None:
                raise InputError(path, f"'rules' must be rule ids or globs such as \"COL*,SHP001\", got {v!r}")
        elif key in ("fail_on", "regression_severity"):
            kw[key] = _severity(path, key, v)
        elif key == "expected_tp":
            kw[key] = _number(path, key, v, integer=True, minimum=1)
        elif key == "expected_attention_family":
            pairs = [("any", v)] if isinstance(v, str) else list(v.items()) if isinstance(v, dict) else None
            if pairs is None:
                raise InputError(path, f"'{key}' must be a family name or a table per phase, got {v!r}")
            families = attention_families()
            for phase, fam in pairs:
                if phase not in ("any", "prefill", "decode", "mixed"):
                    raise _unknown_key(path, f"'{key}'", phase, ["prefill", "decode", "mixed"])
                if fam not in families:
                    raise InputError(
                        path,
                        f"'{key}': unknown attention family {fam!r} (catalog families: {', '.join(sorted(families))})",
                    )
            kw[key] = tuple(pairs)
        elif key == "tolerances":
            if not isinstance(v, dict):
                raise InputError(path, f"'tolerances' must be a table, got {v!r}")
            names = [f.name for f in dataclasses.fields(Tolerances)]
            tol = {}
            for tk, tv in v.items():
                if tk not in names:
                    raise _unknown_key(path, f"{where}.tolerances", tk, names)
                tol[tk] = float(_number(path, f"tolerances.{tk}", tv))
            kw["tolerances"] = Tolerances(**tol)
        elif key == "expect":
            if not isinstance(v, list):
                raise InputError(path, "'expect' must be an array of tables ([[expect]])")
            kw["expectations"] = tuple(_expect_entry(path, i, e) for i, e in enumerate(v))
        elif key in skeys:
            settings_kw[skeys[key]] = _settings_value(path, key, skeys[key], v)
        else:
            raise _unknown_key(path, where, key, known)
        # A check key that is also an engine setting (e.g. once KRN001 reads expected_attention_family)
        # reaches the rules too.
        if key in CHECK_KEYS and key in skeys.values() and key in kw:
            settings_kw[key] = kw[key]
    kw["settings"] = Settings(**settings_kw)
    return CheckConfig(**kw)


def load_config(path: Path | None = None, *, search: bool = True) -> CheckConfig:
    """Read `path` (tracediag.toml or pyproject.toml), else the one `find_config()` finds, else defaults."""
    if path is None and search:
        path = find_config()
    if path is None:
        return CheckConfig()
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    doc = _read_toml(path)
    if path.name == "pyproject.toml":
        table = doc.get("tool", {}).get("tracediag")
        if table is None:
            raise InputError(path, "no [tool.tracediag] table")
        return parse_config(table, path, "[tool.tracediag]")
    if "tool" in doc and set(doc) == {"tool"} and "tracediag" in doc["tool"]:
        return parse_config(doc["tool"]["tracediag"], path, "[tool.tracediag]")
    return parse_config(doc, path, path.name)


def select_rules(patterns: tuple[str, ...], known: list[str]) -> tuple[list[str], list[str]]:
    """(rule ids matched by any glob, globs that matched nothing). Empty patterns select every rule."""
    if not patterns:
        return list(known), []
    chosen = [r for r in known if any(fnmatch.fnmatchcase(r.upper(), p.upper()) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(r.upper(), p.upper()) for r in known)]
    return chosen, unmatched


# ---------------------------------------------------------------------------------------------- runs


@dataclass
class RunData:
    """One run as check/diff compare it: its findings.json document, its store when there is one."""

    label: str  # the path as given
    kind: Literal["findings", "output", "inputs"]
    doc: dict[str, Any]
    db_path: Path | None
    measures: dict[str, Any] = field(default_factory=dict)


def is_findings_json(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".json":
        return False
    with open(path, "rb") as f:
        head = f.read(4096)
    return b'"schema"' in head and FINDINGS_SCHEMA_PREFIX.encode() in head


def read_findings(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith(FINDINGS_SCHEMA_PREFIX):
        raise InputError(path, "not a tracediag findings.json (no 'schema': 'tracediag/findings-v1')")
    if schema != "tracediag/findings-v1":
        raise InputError(path, f"findings schema {schema} is not supported (this version reads tracediag/findings-v1)")
    if not isinstance(doc.get("checks"), list):
        raise InputError(path, "findings.json without a 'checks' list")
    return doc


def load_run(
    path: str | Path,
    workdir: Path,
    *,
    model: str | Path | None = None,
    tp: int | None = None,
    jobs: int | None = None,
    keep_python: bool = False,
    settings: Settings | None = None,
) -> RunData:
    """A findings.json, an analyze output folder (findings.json + trace.duckdb), or inputs to analyze."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, "no such file or directory")
    if is_findings_json(p):
        db = p.parent / "trace.duckdb"
        run = RunData(str(path), "findings", read_findings(p), db if db.is_file() else None)
    elif p.is_dir() and (p / "findings.json").is_file():
        db = p / "trace.duckdb"
        run = RunData(str(path), "output", read_findings(p / "findings.json"), db if db.is_file() else None)
    else:
        from tracediag.analysis import analyze
        from tracediag.output import findings_json

        workdir.mkdir(parents=True, exist_ok=True)
        db = workdir / f"run{len(list(workdir.glob('run*.duckdb')))}.duckdb"
        report = analyze([p], model=model, tp=tp, db_path=db, jobs=jobs, keep_python=keep_python, settings=settings)
        run = RunData(str(path), "inputs", orjson.loads(findings_json(report)), db)  # exactly what findings.json holds
    run.measures = run_measures(run.doc, run.db_path)
    return run


# ---------------------------------------------------------------------------------------------- measures


def t_bucket(T: int | None) -> str:
    """Power-of-two bucket of the step's token count: T=1, T=2, T=3-4, T=5-8, ..., T=33-64."""
    if T is None:
        return "T=?"
    if T <= 2:
        return f"T={T}"
    hi = 1 << (T - 1).bit_length()
    lo = hi // 2 + 1
    return f"T={lo}-{hi}"


def _phase(row: dict[str, Any]) -> str:
    return row.get("phase") or "unphased"


def _section_rows(doc: dict[str, Any], section: str, legacy_key: str) -> list[dict[str, Any]]:
    s = (doc.get("sections") or {}).get(section)
    if isinstance(s, dict) and isinstance(s.get("tables"), dict) and s["tables"]:
        return next(iter(s["tables"].values())) or []
    return doc.get(legacy_key) or []  # README's older top-level layout


def marked_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s.get("dur_ns") and s.get("marker_source") != WHOLE_TRACE]


def step_measures(steps: list[dict[str, Any]], collectives: list[dict[str, Any]]) -> dict[str, Any]:
    """Measures from the steps and collectives tables as findings.json carries them."""
    steps = marked_steps(steps)
    out: dict[str, Any] = {"step_time_ns": {}, "communication_share": {}, "collectives_per_step": {}}
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in steps:
        groups.setdefault((_phase(s), t_bucket(s.get("T"))), []).append(s)
    for (phase, bucket), rows in sorted(groups.items()):
        durs = sorted(r["dur_ns"] for r in rows)
        out["step_time_ns"][f"{phase},{bucket}"] = {
            "phase": phase,
            "T_bucket": bucket,
            "steps": len(rows),
            "median": statistics.median(durs),
            "mean": statistics.fmean(durs),
            "min": durs[0],
            "max": durs[-1],
        }
    by_phase: dict[str, list[dict]] = {}
    for s in steps:
        by_phase.setdefault(_phase(s), []).append(s)
    for phase, rows in sorted(by_phase.items()):
        total = sum(r["dur_ns"] for r in rows)
        coll = sum(r.get("collective_ns") or 0 for r in rows)
        out["communication_share"][phase] = {"value": coll / total if total else None, "steps": len(rows)}
        for col, op in (("all_reduces", "all_reduce"), ("collectives", "all")):
            counts = [r.get(col) or 0 for r in rows]
            out["collectives_per_step"][f"{phase},{op}"] = {
                "phase": phase,
                "op": op,
                "median": statistics.median(counts),
                "min": min(counts),
                "max": max(counts),
                "steps": len(rows),
            }
    per_op: dict[str, dict[str, Any]] = {}
    per_dtype: dict[str, dict[str, Any]] = {}
    for c in collectives:
        for agg, key in ((per_op, c.get("op") or "unknown"), (per_dtype, f"{c.get('op')},{c.get('dtype') or '?'}")):
            a = agg.setdefault(key, {"calls": 0, "sized_calls": 0, "total_payload_bytes": 0, "dtypes": set()})
            a["calls"] += c.get("calls") or 0
            a["sized_calls"] += c.get("sized_calls") or 0
            a["total_payload_bytes"] += c.get("total_payload_bytes") or 0
            a["dtypes"].add(c.get("dtype") or "?")
    for agg in (per_op, per_dtype):
        for a in agg.values():
            a["mean_bytes"] = a["total_payload_bytes"] / a["sized_calls"] if a["sized_calls"] else None
            a["dtypes"] = sorted(a["dtypes"])
    out["payload_per_call"] = dict(sorted(per_op.items()))
    out["payload_by_dtype"] = dict(sorted(per_dtype.items()))
    return out


DISPATCH_GROUPS = {
    "attention": ("attention", "attention_fallback"),
    "gemm": ("gemm", "wo_gemm"),
    "collective": ("collective",),
}

# Work items (kernels on GPU traces, else the innermost classified CPU op of each class) with the step
# they ran in: kernels by their launching runtime call's host time (else their own), ASOF-joined to
# the last step that started before; outside that step's range -> 'outside steps'.
_KERNEL_WORK = """
WITH rt AS (
    SELECT rank, correlation, min(ts_ns) AS ts_ns FROM runtime WHERE correlation IS NOT NULL GROUP BY ALL
),
w AS (
    SELECT k.rank, k.klass, coalesce(k.family, k.klass) AS family, k.dur_ns, coalesce(rt.ts_ns, k.ts_ns) AS anchor
    FROM kernels k LEFT JOIN rt ON rt.rank = k.rank AND rt.correlation = k.correlation
)"""
_CPU_WORK = """
WITH c AS (
    SELECT rank, tid, klass, coalesce(family, klass) AS family, ts_ns, dur_ns FROM cpu_ops
    WHERE klass IS NOT NULL AND klass NOT IN ('other', 'collective')
),
nxt AS (
    -- Ops on one thread nest properly: an op is the innermost of its class when the next op of that
    -- class (in start order) does not start inside it.
    SELECT *, lead(ts_ns) OVER (PARTITION BY rank, tid, klass ORDER BY ts_ns, dur_ns DESC) AS next_ts FROM c
),
leaf AS (
    SELECT * FROM nxt WHERE next_ts IS NULL OR next_ts >= ts_ns + dur_ns
),
w AS (
    SELECT rank, klass, family, dur_ns, ts_ns AS anchor FROM leaf
    UNION ALL
    -- collectives: the backend's work range (gloo worker) or the call, not the enqueue op
    SELECT rank, 'collective', lower(split_part(coalesce(exec_name, call_name), ':', 1)), dur_ns, anchor_ts_ns
    FROM collectives
)"""
_WORK_BY_STEP = """
, ws AS (
    SELECT w.*, s.step_id, s.phase, s.ts_ns AS s_ts, s.dur_ns AS s_dur
    FROM w ASOF LEFT JOIN steps s ON s.rank = w.rank AND w.anchor >= s.ts_ns
)
SELECT klass, family,
    CASE WHEN step_id IS NULL OR anchor >= s_ts + s_dur THEN 'outside steps' ELSE coalesce(phase, 'unphased') END
        AS phase,
    count(*) AS calls, sum(dur_ns) AS total_ns
FROM ws GROUP BY ALL ORDER BY klass, family, phase
"""


def store_measures(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Measures that need the store: kernel-family time, dispatch per phase, attention share."""
    gpu = con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    rows = con.execute((_KERNEL_WORK if gpu else _CPU_WORK) + _WORK_BY_STEP).fetchall()
    work = [dict(zip(("klass", "family", "phase", "calls", "total_ns"), r)) for r in rows]
    steps = con.execute(
        "SELECT coalesce(phase, 'unphased') AS phase, count(*), sum(dur_ns), sum(gpu_end_ns - gpu_ts_ns), "
        f"count(*) FILTER (WHERE marker_source <> '{WHOLE_TRACE}') FROM steps GROUP BY ALL"
    ).fetchall()
    n_steps = sum(r[4] for r in steps)  # marked steps only: per step means nothing for a whole-trace "step"
    denom = {r[0]: (r[3] if gpu else r[2]) for r in steps}
    fam: dict[str, dict[str, Any]] = {}
    for w in work:
        f = fam.setdefault(f"{w['klass']}/{w['family']}", {"klass": w["klass"], "family": w["family"], "calls": 0})
        f["calls"] += w["calls"]
        f["total_ns"] = f.get("total_ns", 0) + int(w["total_ns"] or 0)
    all_ns = sum(f["total_ns"] for f in fam.values())
    for f in fam.values():
        f["per_step_ns"] = f["total_ns"] / n_steps if n_steps else None
        f["mean_ns"] = f["total_ns"] / f["calls"] if f["calls"] else None
        f["share"] = f["total_ns"] / all_ns if all_ns else None
    dispatch: dict[str, dict[str, Any]] = {}
    for group, klasses in DISPATCH_GROUPS.items():
        per_phase: dict[str, dict[str, int]] = {}
        for w in work:
            if w["klass"] in klasses and w["phase"] != "outside steps":
                fams = per_phase.setdefault(w["phase"], {})
                fams[w["family"]] = fams.get(w["family"], 0) + int(w["total_ns"] or 0)
        for phase, fams in sorted(per_phase.items()):
            total = sum(fams.values())
            top = max(sorted(fams), key=lambda k: fams[k])
            dispatch.setdefault(group, {})[phase] = {
                "family": top,
                "share": fams[top] / total if total else None,
                "families_ns": dict(sorted(fams.items(), key=lambda kv: -kv[1])),
            }
    attention: dict[str, Any] = {}
    for phase, d in dispatch.get("attention", {}).items():
        den = denom.get(phase)
        attn = sum(d["families_ns"].values())
        attention[phase] = {"value": attn / den if den else None, "attention_ns": attn, "step_ns": den}
    return {
        "time_basis": "GPU kernels" if gpu else "CPU ops (innermost of each class) and collective work ranges",
        "kernel_family_time": dict(sorted(fam.items(), key=lambda kv: -kv[1]["total_ns"])),
        "dispatch": dispatch,
        "attention_share": attention,
    }


def _steps_and_collectives_from_store(con: duckdb.DuckDBPyConnection) -> tuple[list[dict], list[dict]]:
    # The same rows as findings.json carries: reuse the report sections' own queries.
    from tracediag.reports.sections import collectives as coll_section
    from tracediag.reports.sections import steps as steps_section

    ctx = Context(con=con, model=None, tp=None)
    s, c = steps_section.build(ctx), coll_section.build(ctx)
    return (next(iter(s.tables.values())) if s else []), (next(iter(c.tables.values())) if c else [])


def run_measures(doc: dict[str, Any], db_path: Path | None) -> dict[str, Any]:
    """Key measures of a run: from its store when there is one, else from findings.json alone."""
    if db_path is not None and Path(db_path).is_file():
        con = duckdb.connect(str(db_path), read_only=True)
        try:
            steps, colls = _steps_and_collectives_from_store(con)
            m = step_measures(steps, colls) | store_measures(con)
        finally:
            con.close()
        m["source"] = "store"
        return m
    m = step_measures(_section_rows(doc, "steps", "steps"), _section_rows(doc, "collectives", "collectives_by_rank"))
    m["source"] = "findings.json (no trace.duckdb beside it: no kernel-family time, dispatch or attention share)"
    return m


@dataclass(frozen=True)
class KeyMeasure:
    key: str  # stable: "step_time[decode,T=2]"
    kind: str  # tolerance field name
    label: str  # in words
    value: float
    unit: str  # "ns", "share", "calls", "bytes"
    context: dict[str, Any]


KIND_LABEL = {
    "step_time": ("Step time", "ns", True, 6),
    "communication_share": ("Communication share of step time", "share", False, 3),
    "attention_share": ("Attention share of step time", "share", False, 5),
    "collectives_per_step": ("Collectives per step", "calls", False, 3),
    "payload_per_call": ("Payload per call", "bytes", True, 3),
}  # kind -> (label, unit, relative tolerance?, walk step)


def measure_label(kind: str, ctx: dict[str, Any]) -> str:
    phase = ctx.get("phase", "")
    if kind == "step_time":
        return f"{phase} step time ({ctx['T_bucket']}, median)"
    if kind in ("communication_share", "attention_share"):
        return f"{kind.split('_')[0]} share of {phase} step time"
    if kind == "collectives_per_step":
        op = "collective calls (all ops)" if ctx["op"] == "all" else f"{ctx['op']} calls"
        return f"{op} per {phase} step (median)"
    return f"{ctx['op']} payload per call (mean)"


def key_measures(m: dict[str, Any]) -> dict[str, KeyMeasure]:
    out: dict[str, KeyMeasure] = {}

    def add(kind: str, sub: str, value: Any, ctx: dict[str, Any]) -> None:
        if value is None:
            return
        _, unit, _, _ = KIND_LABEL[kind]
        out[f"{kind}[{sub}]"] = KeyMeasure(f"{kind}[{sub}]", kind, measure_label(kind, ctx), float(value), unit, ctx)

    for sub, s in m.get("step_time_ns", {}).items():
        add("step_time", sub, s["median"], {"phase": s["phase"], "T_bucket": s["T_bucket"], "steps": s["steps"]})
    for phase, s in m.get("communication_share", {}).items():
        add("communication_share", phase, s["value"], {"phase": phase, "steps": s["steps"]})
    for phase, s in m.get("attention_share", {}).items():
        add("attention_share", phase, s["value"], {"phase": phase})
    for sub, s in m.get("collectives_per_step", {}).items():
        add("collectives_per_step", sub, s["median"], {"phase": s["phase"], "op": s["op"], "steps": s["steps"]})
    for op, s in m.get("payload_per_call", {}).items():
        add("payload_per_call", op, s["mean_bytes"], {"op": op, "dtypes": s["dtypes"], "sized_calls": s["sized_calls"]})
    return out


def fmt_measure(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "ns":
        return f"{v / 1e6:.3f} ms" if abs(v) >= 1e5 else f"{v / 1e3:.1f} µs"
    if unit == "share":
        return f"{v * 100:.1f}%"
    if unit == "bytes":
        return f"{v:,.0f} B"
    return f"{v:g}"


@dataclass(frozen=True)
class MeasureChange:
    key: str
    kind: str
    label: str
    unit: str
    before: float | None
    after: float | None
    change: float | None  # relative (after/before − 1) or absolute (after − before), per kind
    relative: bool
    tolerance: float
    regressed: bool
    context: dict[str, Any]

    def words(self) -> str:
        b, a = fmt_measure(self.before, self.unit), fmt_measure(self.after, self.unit)
        if self.change is None:
            return f"{self.label}: {b} → {a}"
        if self.relative:
            ch, tol = f"{self.change * 100:+.1f}%", f"{self.tolerance * 100:g}%"
        elif self.unit == "share":
            ch, tol = f"{self.change * 100:+.1f} points", f"{self.tolerance * 100:g} points"
        else:
            ch, tol = f"{self.change:+g}", f"{self.tolerance:g}"
        return f"{self.label}: {b} → {a} ({ch}, tolerance {tol})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_measures(before: dict[str, Any], after: dict[str, Any], tol: Tolerances) -> list[MeasureChange]:
    """Every key measure of `after`, with the baseline's value and whether it regressed beyond tolerance."""
    b, a = key_measures(before), key_measures(after)
    out = []
    for key in sorted(set(a) | set(b)):
        ma, mb = a.get(key), b.get(key)
        m = ma or mb
        _, _, relative, _ = KIND_LABEL[m.kind]
        t = getattr(tol, m.kind)
        change = None
        if ma and mb:
            if relative:
                change = (ma.value / mb.value - 1) if mb.value else (0.0 if ma.value == 0 else None)
            else:
                change = ma.value - mb.value
        out.append(
            MeasureChange(
                key=key,
                kind=m.kind,
                label=m.label,
                unit=m.unit,
                before=mb.value if mb else None,
                after=ma.value if ma else None,
                change=change,
                relative=relative,
                tolerance=t,
                regressed=change is not None and change > t + 1e-12,
                context=m.context,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- judging


def finding_id(c: dict[str, Any]) -> str:
    """Identity across runs: rule id, plus values['key'] for rules that report several findings."""
    values = c.get("values") if isinstance(c.get("values"), dict) else {}
    key = values.get("key")
    return f"{c['rule']}:{key}" if key is not None else c["rule"]


def at_or_above(severity: str | None, level: str) -> bool:
    return SEVERITY_ORDER.get(severity or "info", 2) <= SEVERITY_ORDER[level]


OutcomeStatus = Literal["pass", "fail", "finding", "skipped"]


@dataclass(frozen=True)
class Outcome:
    """One judged item: a rule, an expectation or a baseline measure (one JUnit test case)."""

    suite: Literal["rules", "expectations", "baseline"]
    id: str  # stable identity (finding_id for rules)
    rule: str
    step: int | None
    name: str  # what is checked, in words
    status: OutcomeStatus  # fail: fails the check; finding: reported, does not fail (known or below fail_on)
    message: str  # one line
    severity: str | None = None
    vs_baseline: str | None = None  # new / worsened / known / improved (None: no baseline)
    check: dict[str, Any] | None = None  # the finding (rules, BASELINE, EXPECT), findings.json shape

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if v is not None}


def _vs_baseline(c: dict[str, Any], base: dict[str, Any] | None, tol: Tolerances) -> str:
    if base is None or base.get("status") != "finding":
        return "new"
    sc, sb = SEVERITY_ORDER.get(c.get("severity") or "info", 2), SEVERITY_ORDER.get(base.get("severity") or "info", 2)
    if sc < sb:
        return "worsened"
    ic, ib = c.get("impact"), base.get("impact")
    if ic is not None and ib is not None and ic - ib > tol.impact + 1e-12:
        return "worsened"
    if sc > sb or (ic is not None and ib is not None and ib - ic > tol.impact + 1e-12):
        return "improved"
    return "known"


def rule_titles() -> dict[str, str]:
    """Rule id -> the rule's fixed title (RuleMeta.title): stable test-case names across runs."""
    from tracediag.engine import load_rules

    return {m.RULE.id: m.RULE.title for m in load_rules()}


def judge_rules(
    checks: list[dict[str, Any]],
    fail_on: str,
    baseline_doc: dict[str, Any] | None,
    tol: Tolerances,
    titles: dict[str, str] | None = None,
) -> list[Outcome]:
    base = {finding_id(c): c for c in baseline_doc["checks"]} if baseline_doc else None
    titles = rule_titles() if titles is None else titles
    out = []
    for c in checks:
        fixed = titles.get(c["rule"]) or (c["title"] if c["status"] == "not_applicable" else "")
        name = f"{c['rule']} {fixed}".strip()
        if c["status"] == "pass":
            out.append(Outcome("rules", c["rule"], c["rule"], c["step"], name, "pass", c["title"]))
            continue
        if c["status"] == "not_applicable":
            out.append(Outcome("rules", c["rule"], c["rule"], c["step"], name, "skipped", c.get("reason") or ""))
            continue
        fid = finding_id(c)
        vs = _vs_baseline(c, base.get(fid), tol) if base is not None else None
        fails = at_or_above(c.get("severity"), fail_on) and vs in (None, "new", "worsened")
        out.append(
            Outcome(
                "rules",
                fid,
                c["rule"],
                c["step"],
                name,
                "fail" if fails else "finding",
                c["title"],
                severity=c.get("severity"),
                vs_baseline=vs,
                check=c,
            )
        )
    return out


def resolve(values: Any, path: str) -> tuple[bool, Any]:
    cur = values
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return False, None
    return True, cur


def _meets(e: Expectation, v: Any) -> bool:
    if isinstance(v, dict):  # e.g. attention_family per phase: every phase must meet it
        return bool(v) and all(_meets(e, x) for x in v.values())

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, str) and isinstance(b, str):
            return a.lower() == b.lower()
        return a == b

    if e.equals is not None and not same(v, e.equals):
        return False
    if e.one_of and not any(same(v, x) for x in e.one_of):
        return False
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    if e.min is not None and not (numeric and v >= e.min):
        return False
    return not (e.max is not None and not (numeric and v <= e.max))


def run_facts(doc: dict[str, Any], measures: dict[str, Any]) -> dict[str, Any]:
    """Facts of the run that expectations with rule = "run" compare."""
    attn = measures.get("dispatch", {}).get("attention", {})
    return {
        "tp": (doc.get("tp") or {}).get("p"),
        "world_size": max((i.get("world_size") or 0 for i in doc.get("inputs", [])), default=None) or None,
        "ranks": len({r for i in doc.get("inputs", []) for r in i.get("ranks", [])}),
        "attention_family": {phase: d["family"] for phase, d in attn.items() if phase != "unphased"}
        or ({"unphased": attn["unphased"]["family"]} if "unphased" in attn else {}),
    }


def _expectation_outcome(
    e: Expectation, status: OutcomeStatus, message: str, step: int | None = None, **more: Any
) -> Outcome:
    """One expectation's outcome: suite "expectations", id EXPECT:<key>, named by the expectation."""
    return Outcome("expectations", f"{EXPECT_RULE}:{e.key}", EXPECT_RULE, step, e.describe(), status, message, **more)


def judge_expectations(
    expectations: list[Expectation], doc: dict[str, Any], measures: dict[str, Any], fail_on: str
) -> list[Outcome]:
    facts = run_facts(doc, measures)
    by_rule = {c["rule"]: c for c in doc.get("checks", [])}
    out = []
    for e in expectations:
        if e.rule == "run":
            found, v = resolve(facts, e.value)
            if not found or v in (None, {}):
                why = {
                    "tp": "the TP degree is not known from the inputs; pass --tp or check the trace",
                    "attention_family": "no attention kernels or ops in the inputs",
                }.get(e.value.split(".")[0], f"the run has no fact '{e.value}'")
                out.append(_expectation_outcome(e, "skipped", why))
                continue
        else:
            c = by_rule.get(e.rule)
            if c is None:
                out.append(_expectation_outcome(e, "skipped", f"rule {e.rule} did not run"))
                continue
            if c["status"] == "not_applicable":
                out.append(_expectation_outcome(e, "skipped", f"{e.rule}: {c.get('reason')}"))
                continue
            found, v = resolve({"status": c["status"], "severity": c.get("severity"), **c.get("values", {})}, e.value)
            if not found:
                out.append(_expectation_outcome(e, "skipped", f"{e.rule} has no value '{e.value}'"))
                continue
        if _meets(e, v):
            out.append(_expectation_outcome(e, "pass", f"{e.key} = {v!r}"))
            continue
        title = f"Expected {e.describe()}; the run has {v!r}"
        chk = Check(
            rule=EXPECT_RULE,
            step=1 if e.value == "tp" else 5 if e.value.startswith("attention_family") else 1,
            status="finding",
            title=title,
            severity=e.severity,
            confidence="high",
            impact=1.0,
            values={
                "key": e.key,
                "expected": e.describe(),
                "actual": v,
                "config_key": e.source,
            },
            next_check="Compare the deployment's configuration with the expectation in the check config.",
        ).to_dict()
        status: OutcomeStatus = "fail" if at_or_above(e.severity, fail_on) else "finding"
        out.append(_expectation_outcome(e, status, title, chk["step"], severity=e.severity, check=chk))
    return out


def _regression_evidence(con: duckdb.DuckDBPyConnection | None, ch: MeasureChange, limit: int) -> list[dict]:
    """Example steps (or calls) behind a regressed measure, so the report and trace can point at them."""
    if con is None:
        return []
    ctx = ch.context
    if ch.kind == "payload_per_call":
        return [
            {
                "rank": r[0],
                "step": r[1],
                "ts_ns": r[2],
                "dur_ns": r[3],
                "name": r[4],
                "payload_bytes": r[5],
                "dtype": r[6],
            }
            for r in con.execute(
                "SELECT rank, step_id, ts_ns, dur_ns, call_name, payload_bytes, dtype FROM collectives "
                "WHERE op = ? AND payload_bytes IS NOT NULL ORDER BY payload_bytes DESC, rank, ts_ns LIMIT ?",
                [ctx["op"], limit],
            ).fetchall()
        ]
    rows = con.execute(
        "SELECT rank, step_id, ts_ns, dur_ns, name, phase, T FROM steps "
        "WHERE coalesce(phase, 'unphased') = ? AND marker_source <> ? "
        "ORDER BY dur_ns DESC",
        [ctx["phase"], WHOLE_TRACE],
    ).fetchall()
    if ch.kind == "step_time":
        rows = [r for r in rows if t_bucket(r[6]) == ctx["T_bucket"]]
    return [
        {"rank": r[0], "step": r[1], "ts_ns": r[2], "dur_ns": r[3], "name": r[4], "phase": r[5], "T": r[6]}
        for r in rows[:limit]
    ]


def judge_baseline(
    changes: list[MeasureChange],
    cfg: CheckConfig,
    baseline_label: str,
    db_path: Path | None,
) -> list[Outcome]:
    con = duckdb.connect(str(db_path), read_only=True) if db_path and Path(db_path).is_file() else None
    out = []
    try:
        for ch in changes:
            name = ch.label
            if ch.before is None or ch.after is None:
                where = "the baseline" if ch.before is None else "this run"
                out.append(
                    Outcome(
                        "baseline", f"{BASELINE_RULE}:{ch.key}", BASELINE_RULE, None, name, "skipped", f"not in {where}"
                    )
                )
                continue
            if not ch.regressed:
                out.append(
                    Outcome("baseline", f"{BASELINE_RULE}:{ch.key}", BASELINE_RULE, None, name, "pass", ch.words())
                )
                continue
            _, unit, relative, step = KIND_LABEL[ch.kind]
            title = f"{ch.words()} — regressed against the baseline"
            chk = Check(
                rule=BASELINE_RULE,
                step=step,
                status="finding",
                title=title,
                severity=cfg.regression_severity,
                confidence="medium" if ch.kind == "step_time" else "high",
                impact=min(1.0, abs(ch.change)) if relative else min(1.0, abs(ch.change) / max(ch.before, 1.0)),
                formula="change = after / before − 1" if relative else "change = after − before",
                substituted=(
                    f"{ch.after:g} / {ch.before:g} − 1 = {ch.change:+.4f} > {ch.tolerance:g}"
                    if relative
                    else f"{ch.after:g} − {ch.before:g} = {ch.change:+g} > {ch.tolerance:g}"
                ),
                values={
                    "key": ch.key,
                    "measure": ch.label,
                    "unit": unit,
                    "before": ch.before,
                    "after": ch.after,
                    "change": ch.change,
                    "tolerance": ch.tolerance,
                    "baseline": baseline_label,
                    **{k: v for k, v in ch.context.items() if k not in ("phase", "op")},
                    **({"phase": ch.context["phase"]} if "phase" in ch.context else {}),
                    **({"op": ch.context["op"]} if "op" in ch.context else {}),
                },
                evidence=_regression_evidence(con, ch, cfg.settings.max_evidence),
                next_check=(
                    "Diff the two runs (tracediag diff BASELINE RUN) to see which kernel family, collective or "
                    "dispatch changed."
                ),
            ).to_dict()
            status: OutcomeStatus = "fail" if at_or_above(cfg.regression_severity, cfg.fail_on) else "finding"
            out.append(
                Outcome(
                    "baseline",
                    f"{BASELINE_RULE}:{ch.key}",
                    BASELINE_RULE,
                    step,
                    name,
                    status,
                    title,
                    cfg.regression_severity,
                    "new",
                    chk,
                )
            )
    finally:
        if con is not None:
            con.close()
    return out


@dataclass
class CheckResult:
    config: CheckConfig
    fail_on: str
    rules_selected: list[str]
    outcomes: list[Outcome]
    doc: dict[str, Any]  # findings.json of this run (selected rules only)
    measures: dict[str, Any]
    baseline: RunData | None = None
    changes: list[MeasureChange] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "fail"]

    @property
    def passed(self) -> bool:
        return not self.failed

    def findings(self) -> list[dict[str, Any]]:
        """Every finding of the run: rules, unmet expectations and baseline regressions (findings.json shape)."""
        return [o.check | {"new": o.vs_baseline not in ("known", "improved")} for o in self.outcomes if o.check]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": CHECK_SCHEMA_ID,
            "passed": self.passed,
            "fail_on": self.fail_on,
            "config": str(self.config.path) if self.config.path else None,
            "rules_selected": self.rules_selected,
            "baseline": {"path": self.baseline.label, "kind": self.baseline.kind} if self.baseline else None,
            "counts": {
                s: sum(1 for o in self.outcomes if o.status == s) for s in ("pass", "fail", "finding", "skipped")
            },
            "outcomes": [o.to_dict() for o in self.outcomes],
            "measures": self.measures,
            "measure_changes": [c.to_dict() for c in self.changes],
        }


def judge(
    doc: dict[str, Any],
    measures: dict[str, Any],
    cfg: CheckConfig,
    *,
    fail_on: str | None = None,
    baseline: RunData | None = None,
    db_path: Path | None = None,
    rules_selected: list[str] | None = None,
) -> CheckResult:
    """Judge one analysed run (its findings.json document and measures) against config and baseline."""
    level = fail_on or cfg.fail_on
    if level not in FAIL_ON_LEVELS:
        raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON_LEVELS)}, got '{level}'")
    cfg = dataclasses.replace(cfg, fail_on=level)
    outcomes = judge_rules(doc["checks"], level, baseline.doc if baseline else None, cfg.tolerances)
    outcomes += judge_expectations(cfg.all_expectations(), doc, measures, level)
    changes: list[MeasureChange] = []
    if baseline is not None:
        changes = compare_measures(baseline.measures, measures, cfg.tolerances)
        outcomes += judge_baseline(changes, cfg, baseline.label, db_path)
    return CheckResult(
        config=cfg,
        fail_on=level,
        rules_selected=rules_selected if rules_selected is not None else [c["rule"] for c in doc["checks"]],
        outcomes=outcomes,
        doc=doc,
        measures=measures,
        baseline=baseline,
        changes=changes,
    )
