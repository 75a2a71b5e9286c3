"""Shared by the kernel and phase rules (SCH001, KRN001-KRN006, SHP002-SHP004, SCH005): per-phase dispatch,
the run's inputs to the byte accounting (p, KV element type, formats as they ran), which kernels served each
quantized module group, bandwidth. Not a rule (no RULE, no check)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracediag.catalog import family_label
from tracediag.context import Context
from tracediag.model import accounting
from tracediag.model.config import DTYPE_BYTES
from tracediag.model.fitting import ols
from tracediag.model.gemm_roles import expected_roles
from tracediag.model.kernel_formats import kernel_format
from tracediag.model.quant import Format

PHASES = ("prefill", "decode", "mixed")
ATTENTION_KLASSES = ("attention", "attention_fallback")
SOURCE_LABEL = {
    "gpu_kernel": "GPU kernel time",
    "cpu_op": "CPU op time (the trace has no GPU kernels: host-side op durations stand in for kernel time)",
}


UNKNOWN_PHASE = "unknown phase"


def unphased_word(domain: dict[str, Any] | None) -> str:
    """What a step with no prefill/decode phase is called, by the workload's domain (derive/domain.py): a training
    job's steps are training; a forward pass of a model that has no prefill or decode (an encoder, a vision,
    diffusion or recommender model) is a forward; only an LLM's step, or one of a trace whose model nothing names,
    is of an unknown phase."""
    if not domain:
        return UNKNOWN_PHASE
    if domain.get("mode") == "training":
        return "training"
    if domain.get("workload") in ("llm", "other", None):
        return UNKNOWN_PHASE
    return "forward"


def workload_domain(ctx: Context) -> dict[str, Any]:
    """The run's domain (derive/domain.py: workload, mode, the counts behind them), read once per context."""
    from tracediag.derive import domain

    return ctx.once("workload_domain", lambda: domain.read(ctx.con)) or {}


def unphased_name(ctx: Context) -> str:
    """unphased_word of the run's domain (read once per memoized context)."""
    return unphased_word(workload_domain(ctx))


def phase_name(phase: str | None, unphased: str) -> str:
    """The step's phase, or `unphased` (unphased_name: training, forward or unknown phase) when it has none."""
    return phase or unphased


def phase_order(phase: str | None) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def source_of(ctx: Context) -> str:
    """'gpu_kernel' when any rank has kernels, else 'cpu_op'."""
    return "gpu_kernel" if ctx.scalar("SELECT count(*) FROM kernels") else "cpu_op"


def step_rows(ctx: Context) -> list[dict[str, Any]]:
    return ctx.rows("SELECT * FROM step_activity ORDER BY rank, step_id")


def dispatch_rows(ctx: Context, klasses: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per phase, klass, family and name: calls, time, steps, and the first event (inside steps only)."""
    rows = ctx.rows(
        """SELECT phase, source, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) AS steps, sum(graph_calls) AS graph_calls,
                  arg_min(rank, first_ts_ns) AS rank, arg_min(step_id, first_ts_ns) AS step,
                  min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE step_id IS NOT NULL AND list_contains(?::VARCHAR[], klass)
           GROUP BY ALL ORDER BY time_ns DESC, phase, klass, family, name, source""",
        [list(klasses)],
    )
    for r in rows:
        r["family_label"] = family_label(r["family"])
    return rows


def call_evidence(r: dict[str, Any], step_key: str = "step", **extra: Any) -> dict[str, Any]:
    """Evidence for a kernel_steps row or group: its (first) event's rank, step, ts_ns and name, `extra`, its calls."""
    event = {"rank": r["rank"], "step": r[step_key], "ts_ns": r["ts_ns"], "name": r["name"]}
    return event | extra | {"calls": r["calls"]}


def phase_evidence(r: dict[str, Any], unphased: str, step_key: str = "step", **extra: Any) -> dict[str, Any]:
    """call_evidence with the step's phase (phase_name) before `extra`, and the time (ns) after the calls."""
    return call_evidence(r, step_key, phase=phase_name(r["phase"], unphased), **extra) | {"time_ns": r["time_ns"]}


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds, 3 significant digits: "12.3 ms"; seconds from 1 s ("?" when unknown)."""
    if ns is None:
        return "?"
    return f"{ns / 1e9:.3g} s" if abs(ns) >= 1e9 else f"{ns / 1e6:.3g} ms"


def dur(ns: float | None) -> str:
    """A duration in the unit a reader expects, 3 significant digits: "850 µs", "3.13 ms", "1.24 s"."""
    if ns is None:
        return "?"
    return f"{ns / 1e3:.3g} µs" if abs(ns) < 1e6 else ms(ns)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def phase_table(steps: list[dict[str, Any]], unphased: str) -> list[dict[str, Any]]:
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
                "phase": phase_name(ph, unphased),
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
    """Least squares t = a·T + b with R² (tracediag.model.fitting.ols) over (T, step ns) points; None unless there
    are >= 3 points and >= 2 distinct T."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    fit = ols([x for x, _ in points], [y for _, y in points])
    if fit is None:
        return None
    return {"a_ns_per_token": fit.slope, "b_ns": fit.intercept, "r2": fit.r2, "n": fit.n, "distinct_T": fit.distinct_x}


# ------------------------------------------------------------------ model byte counts (per rank)
# One accounting for every rule that reasons about bytes: tracediag.model.accounting (weights per module group
# at their real format, MoE experts touched at decode, KV with MLA / sliding windows). The helpers below only
# pick its inputs from the run: p, the KV element type and whether the quantized kernels actually ran.


def tp_degree(ctx: Context) -> tuple[int, str]:
    if ctx.tp is not None:
        return ctx.tp.p, ctx.tp.source
    return 1, "p = 1: no tensor-parallel group in the trace (single rank) and no --tp"


@dataclass(frozen=True)
class KVDtype:
    """Bytes per KV-cache element and where that came from (engine log, kernel name, config, model dtype)."""

    b: float
    name: str
    source: str


# FP8-KV markers in attention / cache kernel names: vLLM's template enum Fp8KVCacheDataType (0 = auto, 1 = fp8 e4m3,
# 2 = fp8 e5m2; csrc/attention, csrc/cache_kernels.cu), TRT-LLM-gen FMHA cubin element codes (QkvE4m3 / KvE4m3 vs
# QkvBfloat16), AITER A16W8 (16-bit queries, 8-bit KV).
_KV_ENUM = re.compile(r"\(vllm::Fp8KVCacheDataType\)([0-2])")
_KV_TRTLLM = re.compile(r"(?:Qkv|Kv|Q[A-Za-z0-9]*Kv)(E4m3|E5m2|Bfloat16|Fp16)")
_KV_AITER = re.compile(r"(?i)a16w8")


def kv_cache_dtype(ctx: Context) -> KVDtype:
    """The KV element type: the engine log's kv_cache_dtype, else an FP8-KV attention/cache kernel name, else the
    checkpoint's declared KV quantization, else the model dtype (2 bytes when it has none)."""
    m = ctx.model
    for facts in startup_facts_by_input(ctx):
        row = facts.get("kv_cache_dtype")
        if row is None:
            continue
        v = str(row["value"]).strip("'\"").removeprefix("torch.")
        if v.startswith("fp8") or "float8" in v:
            return KVDtype(1, v, f"engine log: kv_cache_dtype={v} (line {row['line']})")
        if v in DTYPE_BYTES:
            return KVDtype(DTYPE_BYTES[v], v, f"engine log: kv_cache_dtype={v} (line {row['line']})")
    rows = ctx.rows("SELECT DISTINCT name, klass FROM kernels WHERE klass IN ('attention', 'elementwise')")
    names = [r["name"] for r in rows]
    attention = {r["name"] for r in rows if r["klass"] == "attention"}
    for n in names:
        e = _KV_ENUM.search(n)
        t = _KV_TRTLLM.search(n) if n in attention else None
        aiter = n in attention and _KV_AITER.search(n)
        if (e and e.group(1) != "0") or (t and t.group(1) in ("E4m3", "E5m2")) or aiter:
            return KVDtype(1, "fp8", f"kernel name: FP8 KV cache ({n[:90]})")
    for n in names:
        e = _KV_ENUM.search(n)
        t = _KV_TRTLLM.search(n) if n in attention else None
        if e or t:
            b = m.dtype_bytes if m is not None and m.dtype_bytes else 2
            what = "Fp8KVCacheDataType 0 (auto: the model dtype)" if e else f"{t.group(1)} KV"
            return KVDtype(b, m.dtype if m is not None and m.dtype else "bf16", f"kernel name: {what} ({n[:90]})")
    if m is not None and m.quant is not None and m.quant.kv_cache:
        return KVDtype(
            1, m.quant.kv_cache, f"config: the checkpoint declares an {m.quant.kv_cache} KV cache ({m.quant.source})"
        )
    if m is not None and m.dtype_bytes:
        return KVDtype(
            m.dtype_bytes, m.dtype or "?", f"model dtype {m.dtype} (no kv_cache_dtype in a log, no FP8-KV kernel)"
        )
    return KVDtype(2, "bf16", "assumed 2 bytes (no kv_cache_dtype, no FP8-KV kernel, no torch_dtype)")


def startup_facts_by_input(ctx: Context) -> list[dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in ctx.rows("SELECT * FROM serving_startup ORDER BY input_id, line"):
        out.setdefault(r["input_id"], {}).setdefault(r["key"], r)
    return list(out.values())


def gemm_dispatch(ctx: Context) -> list[dict[str, Any]]:
    """GEMM-class kernels (or CPU ops) by phase and name, with the weight/activation format each reads."""
    rows = ctx.rows(
        """SELECT phase, source, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) FILTER (WHERE step_id IS NOT NULL) AS steps,
                  arg_min(rank, first_ts_ns) AS rank, arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE klass IN ('gemm', 'wo_gemm') GROUP BY ALL
           ORDER BY time_ns DESC, phase, klass, family, name, source"""
    )
    for r in rows:
        r["fmt"] = kernel_format(r["name"], r["source"])
    return [r for r in rows if r["fmt"] is not None]


def kernels_in_words(rows: list[dict[str, Any]]) -> str:
    """'Triton matmul_ogs (MXFP4 MoE) W4A16 (2 kernels, 48 calls)' per family, from format rows."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k in rows:
        by.setdefault((family_label(k["family"]), k["scheme"]), []).append(k)
    return ", ".join(
        f"{fam} {scheme} ({len(ks)} kernel{'s' if len(ks) > 1 else ''}, {sum(k['calls'] for k in ks)} calls)"
        for (fam, scheme), ks in by.items()
    )


def format_row(r: dict[str, Any], unphased: str) -> dict[str, Any]:
    f = r["fmt"]
    return {
        "phase": phase_name(r["phase"], unphased),
        "name": r["name"],
        "family": r["family"],
        "weights": f.weight,
        "scheme": f.scheme,
        "moe": f.moe,
        "format_from": f.how,
        "calls": r["calls"],
        "time_ns": r["time_ns"],
    }


def served_formats(ctx: Context, phase: str | None = None) -> tuple[dict[str, Format], str]:
    """Weight formats as they run: the checkpoint's when a low-bit GEMM kernel ran (in `phase`), else every group
    at the model dtype (the quantization was not applied: the weights were dequantized at load)."""
    m = ctx.model
    if m.quant is None or not m.quant.quantized_groups:
        return accounting.formats(m), f"checkpoint formats ({m.dtype or 'bf16 assumed'})"
    rows = [r for r in gemm_dispatch(ctx) if phase is None or r["phase"] == phase]
    if not rows:
        return accounting.formats(m), f"declared formats ({m.quant.describe()}): no GEMM in the trace to check them"
    ran = [r for r in rows if r["fmt"].lowbit]
    if ran:
        return accounting.formats(m), f"W{m.quant.main_bits} as declared ({m.quant.describe()}): low-bit kernels ran"
    return accounting.formats(m, as_served=False), (
        f"every group at {accounting.base_format(m).name}: the checkpoint declares {m.quant.method} but no low-bit "
        "GEMM kernel ran (see SHP003)"
    )


def w16_formats(m) -> dict[str, Format]:
    return {g: accounting.W16 for g in accounting.formats(m)}


# ------------------------------------------------------------------ bandwidth


SPEC_PEAK = (
    "spec peak from the device properties (memory clock × bus width): a sustained figure is lower, so the floor "
    "is optimistic and the efficiency understated; pass --hbm-bandwidth with a measured sustained bandwidth"
)


def bandwidth(ctx: Context) -> tuple[float | None, str]:
    """Memory bandwidth in bytes/s: --hbm-bandwidth (the user's figure, ideally a measured sustained one) first,
    then the device properties' spec peak (labelled so); else (None, why)."""
    if ctx.settings.hbm_bandwidth_gbs:
        return ctx.settings.hbm_bandwidth_gbs * 1e9, (
            f"--hbm-bandwidth {ctx.settings.hbm_bandwidth_gbs:g} GB/s (given; sustained if measured)"
        )
    for row in ctx.rows("SELECT rank, device_name, device_properties_json FROM inputs WHERE rank IS NOT NULL"):
        bw = _bw_from_props(row["device_properties_json"])
        if bw:
            return bw, f"device properties of rank {row['rank']} ({row['device_name'] or 'GPU'}): {SPEC_PEAK}"
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
    keys = ctx.rows(  # derive/sdpa_ops.sql: the scaled-dot-product-attention ops inside steps
        """SELECT s.rank, s.step_id, max(try_cast(json_extract(o.input_dims, '$[1]') AS BIGINT[])[3]) AS S,
                  max(try_cast(json_extract(o.input_dims, '$[1]') AS BIGINT[])[1]) AS B
           FROM steps s JOIN sdpa_ops o USING (rank, step_id)
           WHERE s.phase = 'decode'
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
    """decode_context from kernel_steps / step_activity; empty when the trace has none (NO_DECODE_STEPS)."""
    return decode_context(ctx)


# ------------------------------------------------------------------ quantized groups: which kernels serve them

# (K, N) roles of the SHP002 table -> module group
ROLE_GROUP = {
    "q_proj": "attention",
    "o_proj": "attention",
    "k_proj/v_proj": "attention",
    "qkv_proj (fused)": "attention",
    "q_a_proj": "attention",
    "q_b_proj": "attention",
    "kv_a_proj_with_mqa": "attention",
    "fused_qkv_a_proj": "attention",
    "kv_b_proj": "attention",
    "gate_proj/up_proj": "dense_mlp",
    "gate_up_proj (fused)": "dense_mlp",
    "down_proj": "dense_mlp",
    "expert gate_up_proj": "experts",
    "expert gate_proj/up_proj": "experts",
    "expert down_proj": "experts",
    "shared_expert gate_up_proj": "shared_experts",
    "shared_expert gate_proj/up_proj": "shared_experts",
    "shared_expert down_proj": "shared_experts",
    "router (replicated)": "router",
}


def role_group(role: str) -> str | None:
    base = role.split(" (H padded", 1)[0].split(" (EP)", 1)[0]
    if base.startswith("lm_head"):
        return "lm_head"
    return ROLE_GROUP.get(base)


def _mark_dequantized(ctx: Context, dense: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Mark `dequantized` the dense projection GEMMs that run on a weight a dequantize op wrote: per (rank, step),
    as many of the step's dense projection GEMMs, in time order, as dequantize calls ran in it (vLLM's AWQ at
    ≥ 256 tokens: `_C::awq_dequantize` then a dense matmul on its output, one pair per projection)."""
    if not dense:
        return dense
    left = {
        (r["rank"], r["step_id"]): r["calls"]
        for r in ctx.rows(
            "SELECT rank, step_id, sum(calls) AS calls FROM kernel_steps WHERE klass = 'dequant' "
            "AND step_id IS NOT NULL GROUP BY ALL"
        )
    }
    for d in dense:
        key = (d["rank"], d["step_id"])
        d["dequantized"] = left.get(key, 0) > 0
        if d["dequantized"]:
            left[key] -= 1
    return dense


def dense_projection_gemms(ctx: Context, p: int) -> list[dict[str, Any]] | None:
    """Dense GEMM ops whose (K, N) is a projection of the config at TP degree p (lm_head excluded): the
    weight is full-size 16-bit. Each carries its role and module group. None when no GEMM shapes were recorded."""
    if not ctx.scalar("SELECT count(*) FROM gemm_shapes"):
        return None
    roles: dict[tuple[int, int], str] = {}
    for r, kn in expected_roles(ctx.model, p).items():
        if not r.startswith("lm_head") and kn not in roles:
            roles[kn] = r
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
            out.append(r | {"role": roles[kn], "group": role_group(roles[kn]), "K": kn[0], "N": kn[1]})
    return out


@dataclass
class GroupVerdict:
    """How one quantized module group ran: 'applied', 'not_applied', 'partly', 'unverified' or 'not_seen'."""

    group: str
    declared: Format
    verdict: str
    why: str
    kernels: list[dict[str, Any]] = field(default_factory=list)  # kernels serving the group (format rows)
    dense_calls: int = 0  # dense projection GEMM calls with this group's full-size (K, N)
    dense_roles: dict[str, int] = field(default_factory=dict)
    dequantized_calls: int = 0  # of them, on a weight a dequantize op of the same step wrote (not counted above)

    def row(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "declared": f"{self.declared.name} ({self.declared.scheme})",
            "verdict": self.verdict,
            "why": self.why,
            "kernels": ", ".join(sorted({f"{k['name'][:60]} [{k['scheme']}]" for k in self.kernels})) or None,
            "dense_projection_calls": self.dense_calls,
            "dequantized_projection_calls": self.dequantized_calls,
        }


def group_dispatch(
    ctx: Context, p: int
) -> tuple[list[GroupVerdict], list[dict[str, Any]], list[dict[str, Any]] | None]:
    """For each quantized module group of the model: which GEMM kernels served it and whether they read weights of
    the declared format. MoE experts are judged on the expert GEMMs (grouped / batched MoE kernels), the other
    groups on the dense GEMMs; recorded GEMM shapes (CPU traces, eager GPU runs) tie dense GEMMs to their group.
    Returns (verdicts, GEMM rows with formats, shape-matched dense projection GEMMs or None)."""
    m = ctx.model
    unphased = unphased_name(ctx)
    gemms = gemm_dispatch(ctx)
    dense = _mark_dequantized(ctx, dense_projection_gemms(ctx, p))
    moe_k = [r for r in gemms if r["fmt"].moe]
    flat_k = [r for r in gemms if not r["fmt"].moe]
    out = []
    for gq in m.quant.quantized_groups:
        fmt, bits = gq.fmt, gq.fmt.weight_bits
        pool = moe_k if gq.group == "experts" else flat_k
        ok = [r for r in pool if r["fmt"].lowbit and r["fmt"].matches_bits(bits) is not False]
        wrong = [r for r in pool if r["fmt"].lowbit and r["fmt"].matches_bits(bits) is False]
        wide = [r for r in pool if r["fmt"].weight == "16-bit"]
        unknown = [r for r in pool if r["fmt"].weight == "?"]
        mine = [d for d in dense or [] if d["group"] == gq.group]
        shaped = [d for d in mine if not d["dequantized"]]
        dequantized = len(mine) - len(shaped)
        roles: dict[str, int] = {}
        for d in shaped:
            roles[d["role"]] = roles.get(d["role"], 0) + 1
        fr = [format_row(r, unphased) for r in ok + wrong + unknown]
        v = GroupVerdict(gq.group, fmt, "", "", fr, len(shaped), roles, dequantized)
        path = (
            f"; {dequantized} dense GEMM call{'s' if dequantized != 1 else ''} on weights a dequantize op of the "
            "same step wrote (the engine's dequantize path: KRN003 weighs it)"
            if dequantized
            else ""
        )
        if gq.group == "experts":
            if ok and not wide and not wrong:
                v.verdict, v.why = "applied", f"expert GEMMs read {fmt.name} weights"
            elif wrong and not ok:
                v.verdict, v.why = "not_applied", f"expert GEMMs read {wrong[0]['fmt'].weight} weights, not {fmt.name}"
            elif wide and not ok:
                v.verdict, v.why = "not_applied", "expert GEMMs read 16-bit weights"
                v.kernels = [format_row(r, unphased) for r in wide]
            elif ok and (wide or wrong):
                v.verdict, v.why = "partly", "some expert GEMMs read 16-bit or other-width weights"
                v.kernels = [format_row(r, unphased) for r in ok + wide + wrong]
            elif unknown:
                v.verdict, v.why = "unverified", "the expert GEMM kernels do not print their weight format"
            elif shaped:
                v.verdict, v.why = "not_applied", "expert GEMMs with full-size 16-bit weights (recorded shapes)"
            else:
                v.verdict, v.why = "not_seen", "no MoE expert GEMM kernel recognised in the trace"
        else:
            if shaped and not ok:
                v.verdict, v.why = "not_applied", "dense GEMMs with this group's full-size (K, N) and no low-bit kernel"
            elif shaped:
                v.verdict, v.why = (
                    "partly",
                    "low-bit kernels ran, but some of this group's GEMMs ran dense on full-size weights",
                )
            elif ok:
                weights = ", ".join(sorted({r["fmt"].weight for r in ok}))
                v.verdict, v.why = "applied", f"low-bit GEMMs ({weights}) ran{path}"
            elif dequantized and not wrong:
                v.verdict, v.why = "applied", f"the weights are dequantized before each GEMM{path}"
            elif wrong:
                v.verdict, v.why = "not_applied", f"GEMMs read {wrong[0]['fmt'].weight} weights, not {fmt.name}"
            elif unknown:
                v.verdict, v.why = "unverified", "the GEMM kernels do not print their weight format"
            elif wide:
                v.verdict, v.why = (
                    "not_applied",
                    "only dense 16-bit GEMM kernels ran (no GEMM shapes to tie them to roles)",
                )
                v.kernels = [format_row(r, unphased) for r in wide]
            else:
                v.verdict, v.why = "not_seen", "no GEMM kernel in the trace"
        out.append(v)
    return out, gemms, dense


def declared_formats(m) -> str:
    """'experts mxfp4 (W4A16); attention, router, embeddings, lm_head bf16 (excluded)' from the group table."""
    if m is None or m.quant is None:
        return "none"
    return m.quant.describe()
