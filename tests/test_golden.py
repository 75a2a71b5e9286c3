"""Golden end-to-end outputs: every check's status, severity, title and values on a few real inputs.

A change in any number a user would read shows up here as a diff to review. After an intended change:
`pytest tests/test_golden.py --update-golden`, then review `git diff tests/golden/` like code.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import KINETO_DATA, REPO, SAMPLES, kineto_file

from tracediag.analysis import analyze

GOLDEN = REPO / "tests" / "golden"


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


def _project(report) -> dict:
    d = report.to_dict()
    return _normal(
        {
            "tp": d["tp"],
            "cost_model_applies": d["cost_model"]["applies"],
            "checks": [
                {k: c.get(k) for k in ("rule", "status", "severity", "title", "reason", "values")} for c in d["checks"]
            ],
        }
    )


@pytest.mark.parametrize("name", list(_cases()))
def test_golden(name, update_golden):
    got = _project(_cases()[name]())
    path = GOLDEN / f"{name}.json"
    if update_golden:
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=False) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"{name}: output changed; review and rerun with --update-golden"
