"""The committed sample traces (and the generator that makes them) show what their README promises.

The expectations are computed from each scenario's ``config.json``, the TP degree in the trace's
``distributedInfo`` and ``T`` parsed from vLLM's step annotation, with docs/method.md's formulas
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
    "math_decode_tp2": (2, None),
    "w4_dense_tp2": (2, None),
    "w4_int4mm_tp2": (2, None),
    "w4_awq_tp2": (2, None),
    "delayed_rank_tp2": (2, None),
}
# Later scenarios whose scenario.json steps carry per-step op counts (sdpa_*_calls, int4pack_mm_calls, ...).
OP_COUNT_SCENARIOS = [
    "math_decode_tp2", "w4_dense_tp2", "w4_int4mm_tp2", "w4_awq_tp2", "delayed_rank_tp2", "healthy_tp1"
]  # fmt: skip
SDPA_MATH = "aten::_scaled_dot_product_attention_math"
SDPA_FLASH_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
INT4_MM = "aten::_weight_int4pack_mm_for_cpu"
INT4_PACK = "aten::_convert_weight_to_int4pack_for_cpu"


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


# ----------------------------------------------------------------------------------------------------------
# Later scenarios: attention backend per phase, 4-bit weight-only GEMMs, a delayed rank, TP = 1
# ----------------------------------------------------------------------------------------------------------


def _steps_with_events(trace: dict) -> list[tuple[dict, list[dict]]]:
    """(step annotation event, the X events of its thread inside it), in time order."""
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in xs if STEP_RE.match(e["name"])), key=lambda e: e["ts"])
    out = []
    for st in steps:
        t0, t1 = st["ts"], st["ts"] + st["dur"]
        out.append((st, [e for e in xs if e["tid"] == st["tid"] and t0 <= e["ts"] and e["ts"] + e["dur"] <= t1]))
    return out


def _count(events: list[dict], name: str) -> int:
    return sum(e["name"] == name for e in events)


@pytest.mark.parametrize("name", OP_COUNT_SCENARIOS)
def test_op_counts_per_step_match_scenario(name: str) -> None:
    directory = SAMPLES / name
    planned = json.loads((directory / "scenario.json").read_text())
    ranks = sorted(directory.glob("rank*.pt.trace.json.gz"))
    assert len(ranks) == planned["tp"]
    for path in ranks:
        trace = _load(path)
        steps = _steps_with_events(trace)
        assert [st["name"] for st, _ in steps] == [p["annotation"] for p in planned["steps"]]
        for (_, events), plan in zip(steps, planned["steps"], strict=True):
            assert _count(events, SDPA_MATH) == plan["sdpa_math_calls"], (path.name, plan["annotation"])
            assert _count(events, SDPA_FLASH_CPU) == plan["sdpa_flash_cpu_calls"]
            assert _count(events, INT4_MM) == plan["int4pack_mm_calls"]
            assert _count(events, "aten::linear") == plan["linear_calls"]
            # vLLM's AWQ ops (w4_awq_tp2 only; 0 everywhere else)
            assert _count(events, "_C::awq_dequantize") == plan.get("awq_dequantize_calls", 0)
            assert _count(events, "_C::awq_gemm") == plan.get("awq_gemm_calls", 0)
        # packing is load time: never inside the profiled window
        assert not any(e.get("name") == INT4_PACK for e in trace["traceEvents"])


def test_math_sdpa_only_in_decode_with_bmm_softmax_children() -> None:
    directory = SAMPLES / "math_decode_tp2"
    config = json.loads((directory / "config.json").read_text())
    planned = json.loads((directory / "scenario.json").read_text())
    assert planned["decode_attention"]["backend"] == "math"
    layers, p = config["num_hidden_layers"], planned["tp"]
    q_local, kv_local, d = config["num_attention_heads"] // p, config["num_key_value_heads"] // p, config["head_dim"]
    for path in sorted(directory.glob("rank*.pt.trace.json.gz")):
        for st, events in _steps_with_events(_load(path)):
            m = STEP_RE.match(st["name"])
            assert m is not None
            decode = int(m.group(1)) == 0
            maths = [e for e in events if e["name"] == SDPA_MATH]
            assert len(maths) == (layers if decode else 0)
            assert _count(events, SDPA_FLASH_CPU) == (0 if decode else layers)
            for e in maths:
                q, k, v = e["args"]["Input Dims"][:3]
                assert q[:3] == [planned["num_seqs"], q_local, 1] and q[3] == d  # one query per sequence
                assert k[1] == v[1] == kv_local
                assert e["args"]["Input type"][:3] == ["c10::BFloat16"] * 3
                t0, t1 = e["ts"], e["ts"] + e["dur"]
                kids = [c["name"] for c in events if t0 <= c["ts"] and c["ts"] + c["dur"] <= t1]
                assert kids.count("aten::bmm") == 2 and kids.count("aten::_softmax") == 1


def _quant(directory: Path) -> tuple[dict, dict, dict]:
    config = json.loads((directory / "config.json").read_text())
    planned = json.loads((directory / "scenario.json").read_text())
    return config, config["quantization_config"], planned


def test_w4_dense_runs_full_size_bf16_linears_only() -> None:
    directory = SAMPLES / "w4_dense_tp2"
    _, qc, planned = _quant(directory)
    assert (qc["quant_method"], qc["bits"]) == ("awq", 4) and planned["w4"]["applied"] is False
    shards = planned["per_rank_shapes"]
    expected = {tuple(shards[k]) for k in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")}
    for path in sorted(directory.glob("rank*.pt.trace.json.gz")):
        events = [e for e in _load(path)["traceEvents"] if e.get("ph") == "X"]
        assert not any(e["name"] in (INT4_MM, INT4_PACK) for e in events)
        linears = [e for e in events if e["name"] == "aten::linear"]
        assert {tuple(e["args"]["Input Dims"][1]) for e in linears} == expected
        assert {e["args"]["Input type"][1] for e in linears} == {"c10::BFloat16"}


def test_w4_int4mm_runs_packed_int4_gemms_with_bf16_activations() -> None:
    directory = SAMPLES / "w4_int4mm_tp2"
    _, qc, planned = _quant(directory)
    g = qc["group_size"]
    assert qc["bits"] == 4 and planned["w4"]["applied"] is True and g in (32, 64, 128, 256)
    shards = planned["per_rank_shapes"]
    names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    packed = {tuple(planned["w4"]["packed_weights"][k]) for k in names}
    assert packed == {(shards[k][0], shards[k][1] // 2) for k in names}  # two 4-bit values per byte
    scales = {tuple(planned["w4"]["scales_and_zeros"][k]) for k in names}
    for path in sorted(directory.glob("rank*.pt.trace.json.gz")):
        events = [e for e in _load(path)["traceEvents"] if e.get("ph") == "X"]
        mms = [e for e in events if e["name"] == INT4_MM]
        assert mms
        assert {tuple(e["args"]["Input Dims"][1]) for e in mms} == packed
        assert {tuple(e["args"]["Input Dims"][3]) for e in mms} == scales
        assert {tuple(e["args"]["Input type"]) for e in mms} == {
            ("c10::BFloat16", "unsigned char", "Scalar", "c10::BFloat16")
        }
        assert {e["args"]["Concrete Inputs"][2] for e in mms} == {str(g)}
        for e in mms:  # K of the activation = 2 x packed width
            assert e["args"]["Input Dims"][0][1] == 2 * e["args"]["Input Dims"][1][1]
        # only lm_head (left unquantized) runs a dense linear
        lm = {tuple(e["args"]["Input Dims"][1]) for e in events if e["name"] == "aten::linear"}
        assert lm == {tuple(shards["lm_head"])}


def test_delayed_rank_arrives_late_at_every_decode_layer_all_reduce() -> None:
    directory = SAMPLES / "delayed_rank_tp2"
    planned = json.loads((directory / "scenario.json").read_text())
    delay = planned["injected_delay"]
    assert delay["rank"] == 1 and delay["ms"] > 0
    delay_us = delay["ms"] * 1000.0
    traces = [_load(directory / f"rank{r}.pt.trace.json.gz") for r in range(planned["tp"])]
    # Both ranks run on one host: Kineto's ts are the same clock, so start times compare across ranks.
    per_rank = [_steps_with_events(t) for t in traces]
    late_waits, early_waits = [], []
    for step_idx, plan in enumerate(planned["steps"]):
        ars = [[e for e in events if e["name"] == "c10d::allreduce_"] for _, events in (r[step_idx] for r in per_rank)]
        assert len(ars[0]) == len(ars[1]) == plan["all_reduce_calls"]
        layer_gaps = [b["ts"] - a["ts"] for a, b in zip(ars[0][1:], ars[1][1:], strict=True)]  # [0] = embedding
        if plan["injected_delay_ms_per_layer_all_reduce"]:
            assert len(layer_gaps) == plan["delayed_all_reduce_calls"]
            assert min(layer_gaps) > delay_us / 3, (plan["annotation"], layer_gaps)
            assert sorted(layer_gaps)[len(layer_gaps) // 2] > 0.6 * delay_us
        else:
            assert sorted(abs(g) for g in layer_gaps)[len(layer_gaps) // 2] < delay_us / 2
    for r, trace in enumerate(traces):
        steps = _steps_with_events(trace)
        gloo = sorted((e for e in trace["traceEvents"] if e.get("name") == "gloo:all_reduce"), key=lambda e: e["ts"])
        decode_gloo_us = sum(
            e["dur"]
            for e in gloo
            for (st, _), plan in zip(steps, planned["steps"], strict=True)
            if plan["phase"] == "decode" and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]
        )
        (late_waits if r == delay["rank"] else early_waits).append(decode_gloo_us)
    # the on-time rank spends its collective time waiting for the late one
    assert min(early_waits) > 3 * max(late_waits)


def test_healthy_tp1_has_no_collectives_and_full_weights() -> None:
    directory = SAMPLES / "healthy_tp1"
    config = json.loads((directory / "config.json").read_text())
    assert config == json.loads((SAMPLES / "healthy_tp2" / "config.json").read_text())
    planned = json.loads((directory / "scenario.json").read_text())
    assert planned["tp"] == 1 and all(st["all_reduce_calls"] == 0 for st in planned["steps"])
    (path,) = sorted(directory.glob("rank*.pt.trace.json*"))
    trace = _load(path)
    assert trace["distributedInfo"]["world_size"] == 1
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert not any(n.startswith(("c10d::", "gloo:")) for n in names)
    h, hidden, d = config["num_attention_heads"], config["hidden_size"], config["head_dim"]
    weights = {tuple(e["args"]["Input Dims"][1]) for e in trace["traceEvents"] if e.get("name") == "aten::linear"}
    assert weights == {
        ((h + 2 * config["num_key_value_heads"]) * d, hidden),
        (hidden, h * d),
        (2 * config["intermediate_size"], hidden),
        (hidden, config["intermediate_size"]),
        (config["vocab_size"], hidden),
    }


def test_sequence_parallel_trace_runs_reduce_scatter_and_all_gather_per_layer() -> None:
    """Megatron SP over gloo, read from the raw JSON: per step 2L + 1 c10d::_reduce_scatter_base_ (each executed
    by gloo as one gloo:all_reduce of the full [T, H] input on its worker thread) and 2L + 2
    c10d::_allgather_base_ ([T/p, H] -> [T, H], plus the logits); no c10d::allreduce_ at all."""
    d = SAMPLES / "sequence_parallel_tp2"
    cfg = json.loads((d / "config.json").read_text())
    plan = json.loads((d / "scenario.json").read_text())["steps"]
    L, H, p = cfg["num_hidden_layers"], cfg["hidden_size"], 2
    for rank in range(p):
        trace = _load(d / f"rank{rank}.pt.trace.json.gz")
        xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        steps = sorted((e for e in xs if STEP_RE.match(e["name"])), key=lambda e: e["ts"])
        assert len(steps) == len(plan) == 7
        for st, want in zip(steps, plan, strict=True):
            t0, t1 = st["ts"], st["ts"] + st["dur"]
            inside = [e for e in xs if t0 <= e["ts"] and e["ts"] + e.get("dur", 0) <= t1]
            m = STEP_RE.match(st["name"])
            T = int(m.group(2)) + int(m.group(4))
            rs = [e for e in inside if e["name"] == "c10d::_reduce_scatter_base_"]
            ag = [e for e in inside if e["name"] == "c10d::_allgather_base_"]
            gloo_ar = [e for e in inside if e["name"] == "gloo:all_reduce"]
            assert not [e for e in inside if e["name"] == "c10d::allreduce_"]
            assert len(rs) == len(gloo_ar) == 2 * L + 1 == want["reduce_scatter_calls"]
            assert len(ag) == 2 * L + 2 == want["all_gather_calls"]
            # c10d::_reduce_scatter_base_ Input Dims: [output [T/p, H], input [T, H], ...]; gloo reduces the input
            assert all(e["args"]["Input Dims"][:2] == [[T // p, H], [T, H]] for e in rs)
            assert all(e["args"]["Input Dims"] == [[T, H]] for e in gloo_ar)
            hidden_ag = [e for e in ag if e["args"]["Input Dims"][1] == [T // p, H]]
            assert len(hidden_ag) == 2 * L + 1


def test_padded_mlp_all_reduces_run_at_the_padded_width() -> None:
    """padded_mlp_allreduce_tp2: per step the embedding and the L attention all-reduces are [T, H = 240], the L MLP
    all-reduces [T, 256] (H rounded up to a multiple of 256), as scenario.json plans."""
    directory = SAMPLES / "padded_mlp_allreduce_tp2"
    config = json.loads((directory / "config.json").read_text())
    planned = json.loads((directory / "scenario.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    width = planned["padded_mlp_allreduce"]["all_reduce_width"]
    assert (hidden, width) == (240, 256)
    for path in sorted(directory.glob("rank*.pt.trace.json.gz")):
        for st, plan in zip(summarize(_load(path)), planned["steps"], strict=True):
            t = st["T"]
            dims = sorted(e["args"]["Input Dims"][0][0][1] for e in st["c10d_allreduce"])
            assert dims == [hidden] * (layers + 1) + [width] * layers
            assert plan["all_reduce_padded_calls"] == layers
            assert plan["all_reduce_padded_payload_bytes"] == t * width * 2
