"""The check configuration: `tracediag.toml` or `[tool.tracediag]` in pyproject.toml, validated key by key.

Every wrong key or value is an InputError naming the file and the key; see `config_reference()` for the
keys, their defaults and meanings (the README's table is generated from the same data).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tracediag.context import Settings
from tracediag.errors import InputError, UsageError

FAIL_ON_LEVELS = ("info", "warning", "error")


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
    require: tuple[str, ...] = ()  # rule id globs that must run: one that could not run makes it inconclusive
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
    "require": (
        "none",
        'rule ids or globs that must run, e.g. `["SHP*", "COL*"]`: a required rule that could not run (not '
        "applicable: an input is missing) makes the check inconclusive (exit 4), with its reason",
    ),
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
    "graph_capture": "the CUDA/HIP graph-capture trace beside its replay (--graph-capture)",
}


_SETTINGS_ALIASES = {"slo": "slo_ms"}  # config key -> Settings field


_EXPECT_KEYS = ("rule", "value", "equals", "one_of", "min", "max", "severity", "name")


_RULE_GLOB = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")


def settings_keys() -> dict[str, str]:
    """Config key -> Settings field, for every field of tracediag.context.Settings."""
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
        rows.append((key, shown, SETTINGS_MEANING.get(key, "engine setting (tracediag.context.Settings)")))
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
    from tracediag.inputfile import regular_file

    regular_file(path, "the config")  # a FIFO or a device would block the check
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not valid TOML (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # an integer past int_max_str_digits (4,300 digits): not a TOMLDecodeError
        raise InputError(path, f"not valid TOML ({str(exc).split(';', 1)[0]})") from None
    except RecursionError:  # arrays nested hundreds deep: the parser recurses once per level
        raise InputError(path, "not valid TOML (arrays or tables nested hundreds of levels deep)") from None
    except OSError as exc:
        raise InputError(path, f"cannot read file ({exc.strerror or exc})") from None


def _unknown_key(path: Path, where: str, key: str, known: list[str]) -> InputError:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return InputError(path, f"unknown key '{key}' in {where}{hint} (known keys: {', '.join(sorted(known))})")


def _number(path: Path, key: str, v: Any, *, integer: bool = False, minimum: float = 0.0) -> float | int:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    # finite and within what a float holds (TOML allows nan, inf and integers of any size)
    ok = ok and not isinstance(v, bool) and -1e300 < v < 1e300 and v == v
    if not ok or v < minimum:
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
    """A config value checked against the type of its Settings field (msgspec), numbers also finite and ≥ 0."""
    if fname == "slo_ms":
        from tracediag.context import SLO_KEYS, parse_slo

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
    want = _settings_types()[fname]
    try:
        value = msgspec.convert(v, want, strict=True)  # the field's own type: int, float | None, str, tuple…
    except msgspec.ValidationError:
        kind = {int: "an integer ≥ 0", float: "a number ≥ 0", str: "a string", bool: "true or false"}
        base = next((t for t in kind if t == want or t in typing.get_args(want)), None)
        raise InputError(path, f"'{key}' must be {kind.get(base, str(want))}, got {v!r}") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # finite and ≥ 0, which types do not say
        return _number(path, key, value, integer=isinstance(value, int))
    return value


@functools.cache
def _settings_types() -> dict[str, Any]:
    """Settings field -> its type (the annotations resolved: the module uses `from __future__ import annotations`)."""
    return typing.get_type_hints(Settings)


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
        if key in ("rules", "require"):
            kw[key] = parse_rule_globs(v)
            if kw[key] is None:
                raise InputError(path, f"'{key}' must be rule ids or globs such as \"COL*,SHP001\", got {v!r}")
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
