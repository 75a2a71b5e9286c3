"""Golden end-to-end outputs: every check's status, severity, title and values on a few real inputs, one file per
rule (tests/golden/rules/RULE.json: that rule's outcome on each input) and one for what the runs share
(tests/golden/runs.json: the TP degree and the cost-model verdict per input). A new rule adds its own file and
touches no other.

A change in any number a user would read shows up here as a diff to review. After an intended change:
`pytest -n 0 tests/test_golden.py --update-golden`, then review `git diff tests/golden/` like code.
"""

from __future__ import annotations

import fcntl
import json
import math
from contextlib import contextmanager

import pytest
from conftest import KINETO_DATA, REPO, SAMPLES, kineto_file

from tracediag.analysis import analyze
from tracediag.engine import load_rules

GOLDEN = REPO / "tests" / "golden"
RULES = GOLDEN / "rules"
RUNS = GOLDEN / "runs.json"


def _cases():
    return {
        "healthy_tp2": lambda: analyze([SAMPLES / "healthy_tp2"], model=SAMPLES / "healthy_tp2" / "config.json"),
        "fault_fp32_comm_tp2": lambda: analyze(
            [SAMPLES / "fault_fp32_comm_tp2"], model=SAMPLES / "fault_fp32_comm_tp2" / "config.json"
        ),
        "math_decode_tp2": lambda: analyze(
            [SAMPLES / "math_decode_tp2"], model=SAMPLES / "math_decode_tp2" / "config.json"
        ),
        "vllm_mi300x_gptoss": lambda: analyze(
            [kineto_file("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")]
        ),
        "a100_nccl": lambda: analyze([kineto_file("hta_a100_rank0of2_nccl_args.json.gz")]),
    }


def _normal(v):
    """Stable JSON: floats to 6 significant digits, paths reduced to file names."""
    if isinstance(v, float):
        return float(f"{v:.6g}") if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {k: _normal(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_normal(x) for x in v]
    if isinstance(v, str) and ("/" in v) and str(REPO) in v:
        # vendored external traces by file name, the repository's own files relative to the checkout
        for root in (str(KINETO_DATA) + "/", str(REPO) + "/"):
            v = v.replace(root, "")
        return v
    return v


def _project(report) -> tuple[dict, dict[str, list]]:
    """(what the run says as a whole, each rule's checks) of one analysis."""
    d = report.to_dict()
    run = _normal({"tp": d["tp"], "cost_model_applies": d["cost_model"]["applies"]})
    by_rule: dict[str, list] = {}
    for c in d["checks"]:
        entry = {k: c.get(k) for k in ("status", "severity", "title", "reason", "values")}
        by_rule.setdefault(c["rule"], []).append(_normal(entry))
    return run, by_rule


def _read(path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


@contextmanager
def _locked(path):
    """The golden file read, changed by the caller and written back under a lock (xdist workers share the files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = _read(path)
        yield doc
        path.write_text(json.dumps(dict(sorted(doc.items())), indent=1, ensure_ascii=False) + "\n")
    path.with_suffix(".lock").unlink(missing_ok=True)


@pytest.mark.parametrize("name", list(_cases()))
def test_golden(name, update_golden):
    run, by_rule = _project(_cases()[name]())
    if update_golden:
        with _locked(RUNS) as doc:
            doc[name] = run
        for rule, checks in by_rule.items():
            with _locked(RULES / f"{rule}.json") as doc:
                doc[name] = checks
    assert _read(RUNS).get(name) == run, f"{name}: tp or cost model changed; review and rerun with --update-golden"
    changed = [rule for rule, checks in by_rule.items() if _read(RULES / f"{rule}.json").get(name) != checks]
    assert not changed, f"{name}: the output of {', '.join(changed)} changed; review and rerun with --update-golden"


def test_one_golden_file_per_registered_rule():
    """Every registered rule has its snapshot and no snapshot outlives its rule (a rule removed or renamed)."""
    known = {m.RULE.id for m in load_rules()}
    files = {p.stem for p in RULES.glob("*.json")}
    assert files == known, f"missing: {sorted(known - files)}; stale: {sorted(files - known)}"
    for p in RULES.glob("*.json"):
        assert set(_read(p)) == set(_cases()), f"{p.name}: not every golden input; rerun with --update-golden"
