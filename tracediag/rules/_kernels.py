"""Shared by the kernel and phase rules (SCH001, KRN001-KRN006, SHP003): per-phase dispatch, model byte
counts, bandwidth. Not a rule (no RULE, no check)."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

import orjson

from tracediag.catalog import family_label
from tracediag.derive import kernel_steps
from tracediag.engine import Context

PHASES = ("prefill", "decode", "mixed")
# SDPA ops that take q as [B, h, Sq, D]: the dispatcher, and the backend ops compiled graphs call directly
SDPA_OPS = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_fused_attention_overrideable",
)
ATTENTION_KLASSES = ("attention", "attention_fallback")
SOURCE_LABEL = {
    "gpu_kernel": "GPU kernel time",
    "cpu_op": "CPU op time (the trace has no GPU kernels: host-side op durations stand in for kernel time)",
}


def prepare(ctx: Context) -> None:
    """Make sure kernel_steps / step_activity exist (a no-op once they are in POST_DERIVATIONS)."""
    kernel_steps.ensure(ctx.con)


def phase_name(phase: str | None) -> str:
    return phase or "unknown phase"


def phase_order(phase: str | None) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def source_of(ctx: Context) -> str:
    """'gpu_kernel' when any rank has kernels, else 'cpu_op'."""
    return "gpu_kernel" if ctx.scalar("SELECT count(*) FROM kernels") else "cpu_op"


def step_rows(ctx: Context) -> list[dict[str, Any]]:
    return ctx.rows("SELECT * FROM step_activity ORDER BY rank, step_id")


def dispatch_rows(ctx: Context, klasses: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per phase, klass, family and name: calls, time, steps, and the first event (inside steps only)."""
    marks = ", ".join("?" for _ in klasses)
    rows = ctx.rows(
        f"""SELECT phase, source, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) AS steps, sum(graph_calls) AS graph_calls,
                  arg_min(rank, first_ts_ns) AS rank, arg_min(step_id, first_ts_ns) AS step,
                  min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE step_id IS NOT NULL AND klass IN ({marks})
           GROUP BY ALL ORDER BY time_ns DESC""",
        list(klasses),
    )
    for r in rows:
        r["family_label"] = family_label(r["family"])
    return rows


def call_evidence(r: dict[str, Any], step_key: str = "step", **extra: Any) -> dict[str, Any]:
    """Evidence for a kernel_steps row or group: its (first) event's rank, step, ts_ns and name, `extra`, its calls."""
    event = {"rank": r["rank"], "step": r[step_key], "ts_ns": r["ts_ns"], "name": r["name"]}
    return event | extra | {"calls": r["calls"]}


def phase_evidence(r: dict[str, Any], step_key: str = "step", **extra: Any) -> dict[str, Any]:
    """call_evidence with the step's phase before `extra`, and the time (ns) after the calls."""
    return call_evidence(r, step_key, phase=phase_name(r["phase"]), **extra) | {"time_ns": r["time_ns"]}


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds, 3 significant digits: "12.3 ms"; seconds from 1 s ("?" when unknown)."""
    if ns is None:
        return "?"
    return f"{ns / 1e9:.3g} s" if abs(ns) >= 1e9 else f"{ns / 1e6:.3g} ms"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def phase_table(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase (prefill, decode, mixed, unknown): steps, time and its share, T distribution, GPU idle share."""
    total = sum(s["step_ns"] or 0 for s in steps) or 1
    out = []
    for ph in [*PHASES, None]:
        rows = [s for s in steps if s["phase"] == ph]
        if not rows:
            continue
        ts = [s["T"] for s in rows if s["T"] is not None]
        t_ns = [s["step_ns"] for s in rows if s["step_ns"] is not None]
        gpu = [s for s in rows if s["kernels"]]
        span = sum(s["gpu_span_ns"] or 0 for s in gpu)
        out.append(
            {
                "phase": phase_name(ph),
                "steps": len(rows),
                "time_ns": sum(t_ns),
                "time_share": sum(t_ns) / total,
                "T_min": min(ts) if ts else None,
                "T_median": median(ts),
                "T_max": max(ts) if ts else None,
                "step_ns_median": median(t_ns),
                "gpu_idle_share": sum(s["gpu_idle_ns"] or 0 for s in gpu) / span if span else None,
            }
        )
    return out


def fit_line(points: list[tuple[float, float]]) -> dict[str, Any] | None:
    """Least squares t = a·T + b with R²; None unless there are >= 3 points and >= 2 distinct T."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    a = sxy / sxx
    b = my - a * mx
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - (a * x + b)) ** 2 for x, y in points)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"a_ns_per_token": a, "b_ns": b, "r2": r2, "n": n, "distinct_T": len({x for x, _ in points})}


# ------------------------------------------------------------------ model byte counts (per rank)


def weight_params(m, p: int) -> dict[str, int] | None:
    """Projection and lm_head parameters one rank holds (Megatron sharding by p); None if shapes are missing."""
    if None in (m.h, m.H_kv, m.D, m.I):
        return None
    q = m.h * m.D
    kv = math.ceil(m.H_kv / p) * m.D if p > 1 else m.H_kv * m.D
    per_layer = m.H * (q // p + 2 * kv) + (q // p) * m.H + 3 * m.H * (m.I // p)
    lm_head = m.H * math.ceil(m.vocab_size / p) if m.vocab_size else 0
    return {"projections": m.L * per_layer, "lm_head": lm_head}


def group_size(m) -> tuple[int | None, str]:
    q = m.quantization or {}
    g = q.get("group_size", q.get("q_group_size"))
    if isinstance(g, int) and g > 0:
        return g, "quantization_config.group_size"
    if isinstance(g, int) and g <= 0:
        return None, "quantization_config.group_size = -1 (per-channel scales)"
    return 128, "assumed G = 128 (no group_size in the config)"


def w16_w4_bytes(m, p: int) -> dict[str, Any] | None:
    """W16 (all weights at 2 bytes) and W4 (projections at 4 bits + one 16-bit scale per G, lm_head 16-bit)."""
    w = weight_params(m, p)
    if w is None:
        return None
    g, g_source = group_size(m)
    proj, head = w["projections"], w["lm_head"]
    f = proj / (proj + head) if proj + head else 1.0
    w16 = 2 * (proj + head)
    w4 = 2 * head + proj * (0.5 + (2 / g if g else 0.0))
    return {
        "W16_bytes": w16,
        "W4_bytes": round(w4),
        "quantized_share_f": f,
        "G": g,
        "G_source": g_source,
        "ratio": w4 / w16,
        "params_projections": proj,
        "params_lm_head": head,
    }


def kv_bytes_per_token(m, p: int, b: int) -> int | None:
    """c = 2·L·H_kv·D·b for the KV heads one rank holds (ceil(H_kv/p) when p > 1)."""
    if None in (m.H_kv, m.D):
        return None
    kv_heads = math.ceil(m.H_kv / p) if p > 1 else m.H_kv
    return 2 * m.L * kv_heads * m.D * b


def tp_degree(ctx: Context) -> tuple[int, str]:
    if ctx.tp is not None:
        return ctx.tp.p, ctx.tp.source
    return 1, "p = 1: no tensor-parallel group in the trace (single rank) and no --tp"


@dataclass(frozen=True)
class DecodeReads:
    """What one rank reads per decode step, by part, at TP degree p (KRN004, KRN005)."""

    p: int
    p_source: str
    b: int  # bytes per activation / KV element: the config's torch_dtype, 2 when it has none
    w: dict[str, Any]  # w16_w4_bytes: W16_bytes, W4_bytes, quantized_share_f, G, ...
    c: int  # KV bytes per token of context, c = 2·L·H_kv·D·b


def decode_reads(ctx: Context) -> DecodeReads:
    """DecodeReads of ctx.model at the run's TP degree (tp_degree)."""
    m = ctx.model
    p, p_source = tp_degree(ctx)
    b = m.dtype_bytes or 2
    return DecodeReads(p, p_source, b, w16_w4_bytes(m, p), kv_bytes_per_token(m, p, b))


# ------------------------------------------------------------------ bandwidth


def bandwidth(ctx: Context) -> tuple[float | None, str]:
    """Memory bandwidth in bytes/s: device properties first, then --hbm-bandwidth; else (None, why)."""
    for row in ctx.rows("SELECT rank, device_name, device_properties_json FROM inputs WHERE rank IS NOT NULL"):
        bw = _bw_from_props(row["device_properties_json"])
        if bw:
            return bw, f"device properties of rank {row['rank']} ({row['device_name'] or 'GPU'})"
    if ctx.settings.hbm_bandwidth_gbs:
        return ctx.settings.hbm_bandwidth_gbs * 1e9, f"--hbm-bandwidth {ctx.settings.hbm_bandwidth_gbs:g} GB/s"
    return None, (
        "missing memory bandwidth: the trace's device properties carry none (Kineto writes no memory clock "
        "or bus width); pass --hbm-bandwidth GB/s"
    )


def _bw_from_props(raw: str | None) -> float | None:
    """Nsight TARGET_INFO_GPU `memoryBandwidth` (bytes/s), or memoryClockRate (kHz) × memoryBusWidth (bits)."""
    if not raw:
        return None
    try:
        props = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    for d in props if isinstance(props, list) else [props]:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("memoryBandwidth"), (int, float)) and d["memoryBandwidth"] > 0:
            return float(d["memoryBandwidth"])
        clk, bus = d.get("memoryClockRate"), d.get("memoryBusWidth")
        if isinstance(clk, (int, float)) and isinstance(bus, (int, float)) and clk > 0 and bus > 0:
            return 2.0 * clk * 1e3 * bus / 8  # DDR: two transfers per clock
    return None


# ------------------------------------------------------------------ decode context (B sequences, S tokens each)

NO_DECODE_STEPS = "missing decode steps: no step of the trace is a decode step (see SCH001)"
_ROCM_GEN = re.compile(r"_generation_(\d+)\(sq(\d+)sk(\d+)")


def decode_context(ctx: Context) -> list[dict[str, Any]]:
    """Per decode step: B active sequences and S = mean KV length per sequence, with where they came from.

    S from the attention op's key shape (aten::scaled_dot_product_attention key [B, H_kv, S, D]), else from
    the ROCm vLLM annotation `_generation_M(sq..sk<total KV tokens>..)`; B from the annotation's generation
    requests, else the key's batch dimension, else T (one token per sequence in decode).
    """
    steps = ctx.rows(
        "SELECT rank, step_id, name, ts_ns, dur_ns, T, gen_reqs FROM steps WHERE phase = 'decode' "
        "ORDER BY rank, step_id"
    )
    keys = ctx.rows(
        f"""SELECT s.rank, s.step_id, max(try_cast(json_extract(o.input_dims, '$[1]') AS BIGINT[])[3]) AS S,
                  max(try_cast(json_extract(o.input_dims, '$[1]') AS BIGINT[])[1]) AS B
           FROM steps s JOIN cpu_ops o ON o.rank = s.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns
           WHERE s.phase = 'decode' AND o.name IN {SDPA_OPS} AND o.input_dims IS NOT NULL
           GROUP BY ALL"""
    )
    by_step = {(k["rank"], k["step_id"]): k for k in keys}
    out = []
    for s in steps:
        k = by_step.get((s["rank"], s["step_id"]), {})
        m = _ROCM_GEN.search(s["name"] or "")
        if k.get("S"):
            S, s_src = k["S"], "key length of aten::scaled_dot_product_attention"
        elif m and int(m.group(1)):
            S, s_src = int(m.group(3)) / int(m.group(1)), "vLLM annotation (KV tokens / generation requests)"
        else:
            S, s_src = None, None
        if s["gen_reqs"]:
            B, b_src = s["gen_reqs"], "vLLM annotation (generation requests)"
        elif k.get("B"):
            B, b_src = k["B"], "batch dimension of the attention key"
        else:
            B, b_src = s["T"], "T (one token per sequence in decode)"
        out.append(s | {"B": B, "B_source": b_src, "S": S, "S_source": s_src})
    return out


def step_events(steps: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """(rank, step_id) -> the head of an evidence row for that step: rank, step, ts_ns, name."""
    return {
        (s["rank"], s["step_id"]): {"rank": s["rank"], "step": s["step_id"], "ts_ns": s["ts_ns"], "name": s["name"]}
        for s in steps
    }


def decode_steps(ctx: Context) -> list[dict[str, Any]]:
    """decode_context once kernel_steps / step_activity exist; empty when the trace has none (NO_DECODE_STEPS)."""
    prepare(ctx)
    return decode_context(ctx)


# ------------------------------------------------------------------ weight-only 4-bit configs


def weight_only_4bit(m) -> str | None:
    """How the config declares 4-bit weights with 16-bit activations (W4A16), or None.

    Keys as Hugging Face quantization_config writes them: AWQ/GPTQ `bits: 4`, bitsandbytes `load_in_4bit`,
    compressed-tensors `config_groups.*.weights.num_bits: 4` without input_activations, `quant_method: mxfp4`.
    """
    q = m.quantization if m is not None else None
    if not q:
        return None
    method = str(q.get("quant_method", "?"))
    if m.weight_bits == 4:
        return f"{method} bits = 4"
    if q.get("load_in_4bit") is True:
        return f"{method} load_in_4bit ({q.get('bnb_4bit_quant_type', '?')})"
    for name, g in (q.get("config_groups") or {}).items():
        w = (g or {}).get("weights") or {}
        if w.get("num_bits") == 4 and not (g or {}).get("input_activations"):
            return f"{method} {name}: weights num_bits = 4, activations not quantized"
    if method.lower() == "mxfp4":
        return "mxfp4 (4-bit microscaled weights)"
    return None


def dense_projection_gemms(ctx: Context, p: int) -> list[dict[str, Any]] | None:
    """Dense GEMM ops whose (K, N) is a projection of the config at TP degree p (lm_head excluded): the
    weight is full-size 16-bit. None when the trace recorded no GEMM shapes."""
    from tracediag.rules.shp002_config_trace_consistency import expected_roles  # the same role table

    if not ctx.scalar("SELECT count(*) FROM gemm_shapes"):
        return None
    roles = {kn: r for r, kn in expected_roles(ctx.model, p).items() if not r.startswith("lm_head")}
    rows = ctx.rows(
        """SELECT g.rank, g.step_id, g.name, g.ts_ns, g.act_dims, g.w_dims, g.act_type, s.phase
           FROM gemm_shapes g LEFT JOIN steps s USING (rank, step_id) ORDER BY g.rank, g.ts_ns"""
    )
    out = []
    for r in rows:
        try:
            act, w = orjson.loads(r["act_dims"] or "null"), orjson.loads(r["w_dims"] or "null")
        except orjson.JSONDecodeError:
            continue
        if not act or not w or len(w) != 2:
            continue
        kn = (act[-1], w[0]) if r["name"] == "aten::linear" else (act[-1], w[-1])
        if kn in roles:
            out.append(r | {"role": roles[kn], "K": kn[0], "N": kn[1]})
    return out
