"""The case runner of the rules, for rules inside the package and outside it.

A case file is TOML, one `[[case]]` table per case (the format of tests/cases/*.toml, docs/adding-a-rule.md
section 4): `name`, the inputs (`trace`, `model`, `tp`, `inputs = [["path", "format"], ...]`, `settings = {...}`,
`tp1_baseline`, `slo = {ttft = 500}`), the expected `status` and what else to check (`severity`,
`reason_contains`, `title_contains`, `values`, `cost_model_applies`). Paths are relative to `root`. The file's
name is the rule's id in lower case (`krn002.toml`); a rule of another package names its module:

    from tracediag.testing import run_cases

    def test_my_rule_cases():
        run_cases("tests/cases/acm001.toml", module="acme_rules.acm001_launch_gaps")

Every case runs `tracediag.analyze` on its inputs with the rule added; cases with the same inputs share one
analysis. A failed expectation is an AssertionError naming the case.
"""

from __future__ import annotations

import functools
import math
import tomllib
from pathlib import Path
from typing import Any

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.findings import Check
from tracediag.rules import module_name


def load_cases(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(rule id, case) of every case in a case file, or in every `*.toml` of a folder (in name order)."""
    path = Path(path)
    files = sorted(path.glob("*.toml")) if path.is_dir() else [path]
    return [(f.stem.upper(), case) for f in files for case in tomllib.loads(f.read_text())["case"]]


@functools.cache
def analysis(root: Path, trace: str | None, model: str | None, tp: int | None, module: str, inputs=(), settings=()):
    """The report of one case's inputs with the rule `module` added (`inputs`: (path, format) pairs; `settings`:
    Settings fields as (name, value) pairs, tp1_baseline a path); cached, so cases on the same inputs share it."""
    fields = {k: (str(root / v) if k == "tp1_baseline" else v) for k, v in settings}
    return analyze(
        [root / trace] if trace else [],
        model=root / model if model else None,
        tp=tp,
        extra_inputs=[(root / p, fmt) for p, fmt in inputs],
        settings=Settings(**fields),
        extra_rules=[module],
    )


def case_settings(case: dict[str, Any]) -> tuple:
    """The case's Settings fields as sorted (name, value) pairs, TOML arrays as tuples (hashable)."""
    s = dict(case.get("settings", {}))
    if "tp1_baseline" in case:
        s["tp1_baseline"] = case["tp1_baseline"]
    if "slo" in case:
        s["slo_ms"] = tuple((k, float(v)) for k, v in case["slo"].items())
    return tuple(sorted((k, _freeze(v)) for k, v in s.items()))


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def _close(got: Any, want: Any) -> bool:
    """Equal, numbers within a relative 1e-6 (pytest.approx's default), lists element by element."""
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_close, got, want))
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) and not isinstance(want, bool):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12)
    return got == want


def check_case(rule: str, case: dict[str, Any], *, module: str | None = None, root: str | Path = ".") -> Check:
    """Run one case of the rule `rule` (its module: `module`, else the built-in rule of that id) and check what
    the case expects; returns the rule's Check."""
    module = module or module_name(rule)
    inputs = tuple(tuple(x) for x in case.get("inputs", ()))
    args = (case.get("trace"), case.get("model"), case.get("tp"), module, inputs, case_settings(case))
    report = analysis(Path(root).resolve(), *args)
    (check,) = [c for c in report.checks if c.rule == rule]
    name = case.get("name", "")
    assert check.status == case["status"], (name, check.to_dict())
    if "severity" in case:
        assert check.severity == case["severity"], (name, check.severity)
    if "reason_contains" in case:
        assert case["reason_contains"] in check.reason, (name, check.reason)
    if "title_contains" in case:
        assert case["title_contains"] in check.title, (name, check.title)
    for key, want in case.get("values", {}).items():
        got = check.values[key]
        assert _close(got, want), f"{name}: {key}: {got} != {want}"
    if "cost_model_applies" in case:
        assert check.cost_model_applies is case["cost_model_applies"], name
    if check.status == "finding":
        # every finding shows its numbers, formula and where in the trace to look
        assert check.formula and check.substituted and check.values and check.evidence and check.next_check, name
        assert all({"rank", "ts_ns", "name"} <= set(e) for e in check.evidence), name
    return check


def run_cases(path: str | Path, *, module: str | None = None, root: str | Path = ".") -> list[Check]:
    """Run every case of a case file (or of every case file in a folder) and check it; the Checks, in order."""
    return [check_case(rule, case, module=module, root=root) for rule, case in load_cases(path)]
