"""CLI flags reach the library: telemetry inputs by kind, settings, and option validation."""

from __future__ import annotations

import pytest

from tracediag.cli import extra_inputs_from
from tracediag.context import parse_slo
from tracediag.errors import UsageError


def test_extra_inputs_map_flags_to_formats(tmp_path):
    m, lg = tmp_path / "m.prom", tmp_path / "s.log"
    assert extra_inputs_from(metrics=[m], log=[lg], bench=None, nccl_tests=[], topology=None) == [
        (m, "prometheus"),
        (lg, "vllm-log"),
    ]


def test_parse_slo():
    assert parse_slo("ttft=500,tpot=50ms, e2el=10000") == (("ttft", 500.0), ("tpot", 50.0), ("e2el", 10000.0))
    assert parse_slo(None) == ()
    for bad in ("ttft", "ttft=-1", "latency=5", "ttft=abc"):
        with pytest.raises(UsageError, match="--slo"):
            parse_slo(bad)
