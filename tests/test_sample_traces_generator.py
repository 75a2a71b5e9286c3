"""The committed sample traces (and the generator that makes them) show what their README promises.

The expectations are computed from each scenario's ``config.json``, the TP degree in the trace's
``distributedInfo`` and ``T`` parsed from vLLM's step annotation, with the rulebook's formulas
(``2L`` all-reduces per step plus the embedding all-reduce, ``T*H*e_a`` bytes per call), and
cross-checked against the generator's own ``scenario.json``.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
STEP_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
DTYPE_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8}

# scenario -> (all-reduces per layer, bytes per element of the layer all-reduces or None for e_a)
SCENARIOS = {
    "healthy_tp2": (2, None),
    "fault_fp32_comm_tp2": (2, 4),
    "fault_extra_allreduce_tp2": (3, None),
    "kv_replicated_tp4": (2, None),
}


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _prod(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def summarize(trace: dict) -> list[dict]:
    """Per engine step: T and the collectives inside it (main-thread c10d ops, gloo worker-thread ops)."""
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in xs if STEP_RE.match(e["name"])), key=lambda e: e["ts"])
    out = []
    for st in steps:
        t0, t1 = st["ts"], st["ts"] + st["dur"]
        inside = [e for e in xs if t0 <= e["ts"] and e["ts"] + e.get("dur", 0) <= t1]
        m = STEP_RE.match(st["name"])
        assert m is not None
        main = [e for e in inside if e["tid"] == st["tid"]]
        gloo_ar = [e["args"] for e in inside if e["name"] == "gloo:all_reduce"]
        out.append(
            {
                "name": st["name"],
                "T": int(m.group(2)) + int(m.group(4)),
                "c10d_allreduce": [e for e in main if e["name"] == "c10d::allreduce_"],
                "c10d_allgather": [e for e in main if e["name"] == "c10d::_allgather_base_"],
                "gloo_allreduce_bytes": [_prod(a["Input Dims"][0]) * DTYPE_BYTES[a["Input type"][0]] for a in gloo_ar],
                "gloo_allgather": [e for e in inside if e["name"] == "gloo:all_gather"],
            }
        )
    return out


def check_scenario(directory: Path, per_layer: int, layer_bytes: int | None) -> None:
    config = json.loads((directory / "config.json").read_text())
    planned = json.loads((directory / "scenario.json").read_text())
    layers, hidden, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    e_a = {"bfloat16": 2, "float16": 2, "float32": 4}[config["torch_dtype"]]
    e_layer = layer_bytes or e_a
    ranks = sorted(directory.glob("rank*.pt.trace.json*"))
    assert len(ranks) == planned["tp"]
    for rank, path in enumerate(ranks):
        assert path.name.startswith(f"rank{rank}.")
        trace = _load(path)
        info = trace["distributedInfo"]
        p = info["world_size"]
        assert (info["rank"], p, info["backend"]) == (rank, planned["tp"], "gloo")
        steps = summarize(trace)
        assert [s["name"] for s in steps] == [s["annotation"] for s in planned["steps"]]
        profiler_steps = [e for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")]
        assert len(profiler_steps) == len(steps)
        for st, plan in zip(steps, planned["steps"], strict=True):
            t = st["T"]
            assert t == plan["T"]
            expected_calls = per_layer * layers + 1  # + vocab-parallel embedding all-reduce
            assert len(st["c10d_allreduce"]) == expected_calls == plan["all_reduce_calls"]
            for e in st["c10d_allreduce"]:
                assert e["args"]["Input Dims"][0] == [[t, hidden]]
            assert sorted(st["gloo_allreduce_bytes"]) == sorted(
                [t * hidden * e_a] + [t * hidden * e_layer] * (per_layer * layers)
            )
            assert plan["all_reduce_layer_payload_bytes"] == t * hidden * e_layer
            # logits: one all-gather of [num_seqs, V/p] shards into [p * num_seqs, V/p]
            assert len(st["c10d_allgather"]) == 1 and len(st["gloo_allgather"]) == 1
            out_dims, in_dims = st["c10d_allgather"][0]["args"]["Input Dims"][:2]
            assert in_dims == [planned["num_seqs"], vocab // p]
            assert out_dims == [p * planned["num_seqs"], vocab // p]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_committed_scenario(name: str) -> None:
    per_layer, layer_bytes = SCENARIOS[name]
    check_scenario(SAMPLES / name, per_layer, layer_bytes)


def test_kv_heads_are_replicated_in_tp4_trace() -> None:
    directory = SAMPLES / "kv_replicated_tp4"
    config = json.loads((directory / "config.json").read_text())
    p, d, hidden = 4, config["head_dim"], config["hidden_size"]
    assert config["num_key_value_heads"] < p
    q_local, kv_local = config["num_attention_heads"] // p, 1  # ceil(H_kv / p)
    trace = _load(directory / "rank0.pt.trace.json.gz")
    weights = {tuple(e["args"]["Input Dims"][1]) for e in trace["traceEvents"] if e.get("name") == "aten::linear"}
    assert ((q_local + 2 * kv_local) * d, hidden) in weights  # fused QKV shard holds a whole KV head
    kv_dims = {
        e["args"]["Input Dims"][1][1]
        for e in trace["traceEvents"]
        if e.get("name") == "aten::_scaled_dot_product_flash_attention_for_cpu"
    }
    assert kv_dims == {kv_local}
