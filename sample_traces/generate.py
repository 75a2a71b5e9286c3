"""Generate real PyTorch profiler (Kineto) traces of a tensor-parallel Llama-shaped decoder on the CPU.

A small Llama-style decoder runs with Megatron-style tensor parallelism as ``p`` processes (gloo backend,
one process per rank) through an engine loop shaped like vLLM V1: a prefill step followed by decode
steps over a KV cache, each step wrapped in vLLM's ``execute_context_..._generation_...`` annotation.
Every rank is profiled with ``torch.profiler`` and writes its own Chrome trace with
``export_chrome_trace`` (gzip-compressed by torch itself). The JSON is never touched afterwards.

Usage::

    python sample_traces/generate.py --all                       # regenerate the committed scenarios
    python sample_traces/generate.py --scenario healthy_tp2 --out /tmp/healthy
    python sample_traces/generate.py --scenario healthy_tp2 --large --out /tmp/big   # >=200 MB per rank

Each output directory holds ``rank{r}.pt.trace.json.gz`` per rank, the model's Hugging Face style
``config.json`` and ``scenario.json`` (the run's parameters and what a diagnosis should find, computed
from the same parameters that drove the run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

HERE = Path(__file__).resolve().parent

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    """Hugging Face Llama config values (the symbols of the rulebook in comments)."""

    num_hidden_layers: int = 4  # L
    hidden_size: int = 256  # H
    intermediate_size: int = 704  # I
    num_attention_heads: int = 8  # h
    num_key_value_heads: int = 4  # H_kv
    head_dim: int = 32  # D
    vocab_size: int = 2048
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    torch_dtype: str = "bfloat16"

    def hf_config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": self.torch_dtype,
        }


@dataclass(frozen=True)
class RunSpec:
    """Everything one generation run needs; picklable so spawned ranks receive it."""

    name: str
    tp: int
    shape: ModelShape
    description: str = ""
    comm_fp32: bool = False  # fault: row-parallel outputs upcast to fp32 before their all-reduce
    extra_allreduce: bool = False  # fault: one more all-reduce per layer (unfused MLP bias)
    num_seqs: int = 2
    prompt_len: int = 24
    decode_steps: int = 6
    rounds: int = 1  # each round: one prefill step of num_seqs sequences, then decode_steps decode steps
    seed: int = 1234
    threads: int = 1
    gzip: bool = True
    # Fault: decode-step attention forced onto the MATH SDPA backend (prefill keeps the flash CPU kernel).
    decode_attn_math: bool = False
    # 4-bit weight-only checkpoint: None (bf16 checkpoint), "dense" (config says AWQ W4 but the projections
    # run dense bf16 full-size weights: quantization not applied), "int4mm" (projections run
    # aten::_weight_int4pack_mm_for_cpu on weights packed at load time) or "awq" (vLLM's AWQ path: steps of at
    # least AWQ_DEQUANT_TOKENS tokens dequantize each weight with _C::awq_dequantize, then a dense matmul;
    # smaller ones run the fused _C::awq_gemm; both ops registered here under vLLM's names and schemas).
    w4: str | None = None
    w4_group_size: int = 32
    # Fault: this rank sleeps ``delay_ms`` before each decoder-layer all-reduce of every decode step.
    delay_rank: int | None = None
    delay_ms: float = 0.0
    # Megatron-style sequence parallelism: the residual stream is split along the tokens between the ranks;
    # each row-parallel output is reduce-scattered (instead of all-reduced) and each column-parallel input
    # all-gathered (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models").
    sequence_parallel: bool = False
    # The MLP's row-parallel output all-reduced at a padded width: [T, H] padded with zeros to the hidden size
    # rounded up to this multiple, all-reduced, sliced back to [T, H] (an MLP/MoE kernel that works on a padded
    # hidden size and returns its padded output); 0: no padding.
    mlp_allreduce_pad_multiple: int = 0
    expected_findings: tuple[tuple[str, str, str], ...] = ()  # (rule, status, what) for scenario.json


SCENARIOS: dict[str, RunSpec] = {
    "healthy_tp2": RunSpec(
        name="healthy_tp2",
        tp=2,
        shape=ModelShape(),
        description="Megatron-style TP=2, bf16 activations: 2 all-reduces per layer plus the "
        "vocab-parallel embedding all-reduce and the logits all-gather.",
    ),
    "fault_fp32_comm_tp2": RunSpec(
        name="fault_fp32_comm_tp2",
        tp=2,
        shape=ModelShape(),
        comm_fp32=True,
        description="As healthy_tp2, but the row-parallel outputs (attention o_proj, MLP down_proj) are "
        "upcast to float32 before each all-reduce and cast back to bf16 after it: payload 2x T*H*2 bytes.",
    ),
    "fault_extra_allreduce_tp2": RunSpec(
        name="fault_extra_allreduce_tp2",
        tp=2,
        shape=ModelShape(),
        extra_allreduce=True,
        description="As healthy_tp2, plus one extra [T, H] all-reduce per layer after the MLP "
        "(an unfused bias all-reduce: each rank all-reduces bias/p): 3L + 1 all-reduces per step.",
    ),
    "kv_replicated_tp4": RunSpec(
        name="kv_replicated_tp4",
        tp=4,
        shape=ModelShape(num_key_value_heads=2),
        description="TP=4 with only 2 KV heads (H_kv < p): each rank holds ceil(2/4) = 1 KV head, KV heads "
        "replicated on 2 ranks each; collectives as healthy.",
    ),
    "math_decode_tp2": RunSpec(
        name="math_decode_tp2",
        tp=2,
        shape=ModelShape(),
        decode_attn_math=True,
        description="As healthy_tp2, but decode-step attention runs inside "
        "sdpa_kernel(SDPBackend.MATH): aten::_scaled_dot_product_attention_math (bmm, softmax, bmm) in "
        "decode, aten::_scaled_dot_product_flash_attention_for_cpu in prefill.",
        expected_findings=(
            ("KRN001", "finding", "decode phase runs the math SDPA fallback (L per step); prefill runs flash"),
            ("COL001", "pass", "2L + 1 all-reduces per step"),
        ),
    ),
    "w4_dense_tp2": RunSpec(
        name="w4_dense_tp2",
        tp=2,
        shape=ModelShape(),
        w4="dense",
        description="config.json declares a 4-bit AWQ checkpoint (group size 32), but the projections run "
        "dense bf16 aten::linear/aten::mm on full-size [out/p, in] weights; no int4 kernel runs "
        "(quantization not applied).",
        expected_findings=(
            ("SHP003", "finding", "4-bit config but dense bf16 GEMMs with full-size weights, no W4A16 kernel"),
            ("KRN003", "finding", "no W4A16 kernel in any step"),
        ),
    ),
    "w4_int4mm_tp2": RunSpec(
        name="w4_int4mm_tp2",
        tp=2,
        shape=ModelShape(),
        w4="int4mm",
        description="config.json declares a 4-bit AWQ checkpoint (group size 32); the qkv/o/gate_up/down "
        "projections run aten::_weight_int4pack_mm_for_cpu (bf16 activations) on weights packed at load time "
        "with aten::_convert_weight_to_int4pack_for_cpu; lm_head stays bf16 (as AWQ leaves it).",
        expected_findings=(
            ("SHP003", "pass", "4-bit config and the projections run the int4 packed mm"),
            ("KRN003", "pass", "fused W4A16 (int4 packed mm) kernel, no separate dequantize before a dense GEMM"),
        ),
    ),
    "w4_awq_tp2": RunSpec(
        name="w4_awq_tp2",
        tp=2,
        shape=ModelShape(),
        w4="awq",
        prompt_len=128,  # 2 x 128 = 256 prefill tokens: vLLM's AWQ dequantizes at >= 256 tokens
        description="config.json declares a 4-bit AWQ checkpoint (group size 32), run as vLLM's AWQ linear method "
        "(vllm/model_executor/layers/quantization/awq.py): the 256-token prefill steps dequantize every "
        "projection weight (_C::awq_dequantize) and multiply it dense (aten::matmul); the 2-token decode steps run "
        "the fused _C::awq_gemm. The two ops are registered on the CPU with vLLM's schemas "
        "(csrc/torch_bindings.cpp); lm_head stays bf16.",
        expected_findings=(
            ("SHP003", "pass", "4-bit config and the projections run AWQ ops"),
            ("KRN003", "finding", "separate dequantize before dense GEMMs in prefill steps only; decode fused"),
        ),
    ),
    "delayed_rank_tp2": RunSpec(
        name="delayed_rank_tp2",
        tp=2,
        shape=ModelShape(),
        delay_rank=1,
        delay_ms=3.0,
        description="As healthy_tp2, but in every decode step rank 1 sleeps 3 ms (time.sleep) before each "
        "decoder-layer all-reduce: it arrives late at every layer collective and rank 0's gloo:all_reduce "
        "time is mostly waiting for it.",
        expected_findings=(
            ("COL005", "finding", "straggler rank 1: starts each decode layer all-reduce ~3 ms after rank 0"),
            ("COL001", "pass", "2L + 1 all-reduces per step"),
        ),
    ),
    "wide_tp2": RunSpec(
        name="wide_tp2",
        tp=2,
        shape=ModelShape(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=8192,
        ),
        num_seqs=8,
        description="A wider Llama-shaped model (H=4096, I=11008, 32 heads, 8 KV heads, 2 layers) at TP=2 with "
        "8 sequences: the projection compute per token is large enough that splitting it pays for the gloo "
        "all-reduce latency at the decode T = 8 (TP profitability, COL003 pass).",
        expected_findings=(("COL003", "pass", "decode T = 8 above the break-even T*"),),
    ),
    "sequence_parallel_tp2": RunSpec(
        name="sequence_parallel_tp2",
        tp=2,
        shape=ModelShape(),
        sequence_parallel=True,
        description="As healthy_tp2 with Megatron-style sequence parallelism: the residual stream and the norms "
        "run on T/p tokens per rank; before each column-parallel GEMM (qkv, gate_up) an all-gather rebuilds "
        "[T, H], after each row-parallel GEMM (o_proj, down_proj) a reduce-scatter sums and splits it again; "
        "the vocab-parallel embedding is reduce-scattered, the final norm's output all-gathered. On gloo "
        "each reduce_scatter_tensor runs as an all-reduce of the full input on the worker thread.",
        expected_findings=(
            (
                "COL001",
                "finding",
                "no all-reduce: 2L + 1 reduce-scatters and 2L + 1 all-gathers per step (sequence "
                "parallelism); the SP variant of the cost model applies",
            ),
        ),
    ),
    "padded_mlp_allreduce_tp2": RunSpec(
        name="padded_mlp_allreduce_tp2",
        tp=2,
        shape=ModelShape(hidden_size=240),
        mlp_allreduce_pad_multiple=256,
        description="As healthy_tp2 with H = 240 (8 heads of D = 32), and the MLP's down_proj output padded with "
        "zeros to 256 columns (H rounded up to a multiple of 256, +6.7 %) before its all-reduce and sliced back "
        "after: L of the 2L + 1 all-reduces per step are [T, 256], the others [T, 240].",
        expected_findings=(
            ("COL002", "pass", "payloads within tolerance of T*H*e_a; L of 2L + 1 all-reduces padded to 256 (+6.7 %)"),
        ),
    ),
    "healthy_tp1": RunSpec(
        name="healthy_tp1",
        tp=1,
        shape=ModelShape(),
        description="The healthy model at p = 1 (one process, gloo group of 1): no collectives (as vLLM skips "
        "them at TP=1), full-size weights; the TP=1 baseline for the projection slope.",
        expected_findings=(("COL001", "not_applicable", "p = 1: no collectives"),),
    ),
}


# The 4-bit weight-only quantization_config written into config.json, with the key names Hugging Face
# writes for AutoAWQ checkpoints (e.g. TheBloke/Yarn-Mistral-7B-64k-AWQ config.json: quant_method,
# zero_point, group_size, bits, version). Group size 32 so that every per-rank input dimension K
# (H = 256, q_local*D = 128, I/p = 352) is a multiple of it, as vLLM's AWQ requires under TP.
def awq_quantization_config(group_size: int) -> dict:
    return {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm"}


def hf_config(spec: RunSpec) -> dict:
    config = spec.shape.hf_config()
    if spec.w4 is not None:
        config["quantization_config"] = awq_quantization_config(spec.w4_group_size)
    return config


# --large: enough recorded steps that one rank's uncompressed trace is well over 200 MB.
LARGE_OVERRIDES = {"num_hidden_layers": 32, "rounds": 4, "decode_steps": 19}


# ----------------------------------------------------------------------------------------------------------
# Sharding arithmetic (pure functions, also used to write scenario.json)
# ----------------------------------------------------------------------------------------------------------


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads each rank holds: H_kv/p, or 1 replicated head when p > H_kv (vLLM/Megatron rule)."""
    if kv_heads >= tp:
        if kv_heads % tp:
            raise ValueError(f"num_key_value_heads={kv_heads} not divisible by tp={tp}")
        return kv_heads // tp
    if tp % kv_heads:
        raise ValueError(f"tp={tp} not a multiple of num_key_value_heads={kv_heads}")
    return 1


def kv_head_range(kv_heads: int, tp: int, rank: int) -> tuple[int, int]:
    """Global KV head indices [start, end) held by ``rank``."""
    if kv_heads >= tp:
        n = kv_heads // tp
        return rank * n, (rank + 1) * n
    replicas = tp // kv_heads
    head = rank // replicas
    return head, head + 1


def validate(spec: RunSpec) -> None:
    s, p = spec.shape, spec.tp
    for what, value in (
        ("num_attention_heads", s.num_attention_heads),
        ("intermediate_size", s.intermediate_size),
        ("vocab_size", s.vocab_size),
    ):
        if value % p:
            raise ValueError(f"{what}={value} is not divisible by tp={p}")
    if s.num_attention_heads % s.num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    kv_heads_per_rank(s.num_key_value_heads, p)
    if spec.prompt_len + spec.decode_steps > s.max_position_embeddings:
        raise ValueError("prompt_len + decode_steps exceeds max_position_embeddings")
    if s.torch_dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {s.torch_dtype}")
    if spec.w4 not in (None, "dense", "int4mm", "awq"):
        raise ValueError(f"unknown w4 mode {spec.w4!r}")
    if spec.w4 is not None:
        for k in (s.hidden_size, (s.num_attention_heads // p) * s.head_dim, s.intermediate_size // p):
            if k % spec.w4_group_size:
                raise ValueError(f"per-rank input size {k} is not a multiple of group_size {spec.w4_group_size}")
    if spec.w4 == "int4mm" and s.torch_dtype != "bfloat16":
        raise ValueError("the int4 packed mm scenario is made with bfloat16 activations")
    if spec.delay_rank is not None and not 0 <= spec.delay_rank < p:
        raise ValueError(f"delay_rank={spec.delay_rank} is not a rank of tp={p}")
    if spec.sequence_parallel:
        if p == 1 or spec.comm_fp32 or spec.extra_allreduce:
            raise ValueError("sequence parallelism needs p > 1 and no all-reduce fault")
        for t in (spec.num_seqs * spec.prompt_len, spec.num_seqs):
            if t % p:
                raise ValueError(f"sequence parallelism splits the T = {t} tokens of a step: not divisible by p={p}")


def step_annotation(ctx_reqs: int, ctx_tokens: int, gen_reqs: int, gen_tokens: int) -> str:
    """vLLM V1's per-step profiler annotation (gpu_worker.annotate_profile / compute_iteration_details)."""
    return f"execute_context_{ctx_reqs}({ctx_tokens})_generation_{gen_reqs}({gen_tokens})"


def planned_steps(spec: RunSpec) -> list[dict]:
    """The recorded engine steps, in order, with what each should show in the trace."""
    s, p = spec.shape, spec.tp
    e_layer = 4 if spec.comm_fp32 else DTYPE_BYTES[s.torch_dtype]
    e_act = DTYPE_BYTES[s.torch_dtype]
    per_layer = 3 if spec.extra_allreduce else 2
    steps = []
    for _ in range(spec.rounds):
        phases = [("prefill", spec.num_seqs * spec.prompt_len)]
        phases += [("decode", spec.num_seqs)] * spec.decode_steps
        for phase, t in phases:
            if phase == "prefill":
                name = step_annotation(spec.num_seqs, t, 0, 0)
            else:
                name = step_annotation(0, 0, spec.num_seqs, t)
            layer_ar_bytes = t * s.hidden_size * e_layer
            collectives = p > 1
            step = {
                "annotation": name,
                "phase": phase,
                "T": t,
                "all_reduce_calls": per_layer * s.num_hidden_layers + 1 if collectives else 0,
                "all_reduce_layer_calls": per_layer * s.num_hidden_layers if collectives else 0,
                "all_reduce_layer_payload_bytes": layer_ar_bytes,
                "all_reduce_layer_dtype": "float32" if spec.comm_fp32 else s.torch_dtype,
                "all_reduce_embedding_payload_bytes": t * s.hidden_size * e_act,
                "all_gather_calls": 1 if collectives else 0,
                "all_gather_input_bytes": spec.num_seqs * (s.vocab_size // p) * e_act,
                "all_gather_output_bytes": spec.num_seqs * s.vocab_size * e_act,
            }
            if spec.sequence_parallel:
                e = e_act
                step |= {
                    "all_reduce_calls": 0,
                    "all_reduce_layer_calls": 0,
                    # 2 per layer + the embedding; each sums the [T, H] partial output and keeps T/p rows
                    "reduce_scatter_calls": 2 * s.num_hidden_layers + 1,
                    "reduce_scatter_input_bytes": t * s.hidden_size * e,
                    "reduce_scatter_output_bytes": t * s.hidden_size * e // p,
                    # 2 per layer + the final norm's output, [T/p, H] -> [T, H]; + the logits all-gather
                    "all_gather_calls": 2 * s.num_hidden_layers + 2,
                    "all_gather_hidden_calls": 2 * s.num_hidden_layers + 1,
                    "all_gather_hidden_input_bytes": t * s.hidden_size * e // p,
                    "all_gather_hidden_output_bytes": t * s.hidden_size * e,
                    "gloo_all_reduce_ranges": 2 * s.num_hidden_layers + 1,  # what gloo runs for each reduce-scatter
                }
                del step["all_reduce_layer_payload_bytes"], step["all_reduce_layer_dtype"]
                del step["all_reduce_embedding_payload_bytes"]
            step.update(_extra_step_facts(spec, phase, t))
            steps.append(step)
    return steps


def _extra_step_facts(spec: RunSpec, phase: str, t: int = 0) -> dict:
    """Per-step expectations of the later scenarios (empty for the first four, whose scenario.json is fixed)."""
    s = spec.shape
    layers = s.num_hidden_layers
    out: dict = {}
    if spec.decode_attn_math or spec.w4 is not None or spec.delay_rank is not None or spec.tp == 1:
        math = spec.decode_attn_math and phase == "decode"
        out["sdpa_math_calls"] = layers if math else 0
        out["sdpa_flash_cpu_calls"] = 0 if math else layers
        int4 = spec.w4 == "int4mm"
        out["int4pack_mm_calls"] = 4 * layers if int4 else 0  # qkv, o, gate_up, down per layer
        if spec.w4 == "awq":
            dequant = t >= AWQ_DEQUANT_TOKENS
            out["awq_dequantize_calls"] = 4 * layers if dequant else 0
            out["awq_gemm_calls"] = 0 if dequant else 4 * layers
        quantized = spec.w4 in ("int4mm", "awq")
        out["linear_calls"] = 1 if quantized else 4 * layers + 1  # + lm_head (never quantized)
    if spec.mlp_allreduce_pad_multiple:
        width = s.hidden_size + (-s.hidden_size % spec.mlp_allreduce_pad_multiple)
        out["all_reduce_padded_calls"] = layers  # the MLP's; the attention block's stay at H
        out["all_reduce_padded_payload_bytes"] = t * width * DTYPE_BYTES[s.torch_dtype]
    if spec.delay_rank is not None:
        delayed = phase == "decode"
        out["delayed_rank"] = spec.delay_rank
        out["injected_delay_ms_per_layer_all_reduce"] = spec.delay_ms if delayed else 0.0
        out["delayed_all_reduce_calls"] = 2 * layers if delayed else 0
    return out


def scenario_record(spec: RunSpec) -> dict:
    s, p = spec.shape, spec.tp
    kv_local = kv_heads_per_rank(s.num_key_value_heads, p)
    q_local = s.num_attention_heads // p
    d = s.head_dim
    return {
        "scenario": spec.name,
        "description": spec.description,
        "torch_version": torch.__version__,
        "backend": "gloo",
        "device": "cpu",
        "tp": p,
        "comm_fp32": spec.comm_fp32,
        "extra_allreduce_per_layer": spec.extra_allreduce,
        **({"sequence_parallel": True} if spec.sequence_parallel else {}),
        "num_seqs": spec.num_seqs,
        "prompt_len": spec.prompt_len,
        "decode_steps_per_round": spec.decode_steps,
        "rounds": spec.rounds,
        "seed": spec.seed,
        "per_rank_shapes": {
            "q_heads": q_local,
            "kv_heads": kv_local,
            "kv_heads_replicated": s.num_key_value_heads < p,
            "embed_tokens": [s.vocab_size // p, s.hidden_size],
            "qkv_proj": [(q_local + 2 * kv_local) * d, s.hidden_size],
            "o_proj": [s.hidden_size, q_local * d],
            "gate_up_proj": [2 * s.intermediate_size // p, s.hidden_size],
            "down_proj": [s.hidden_size, s.intermediate_size // p],
            "lm_head": [s.vocab_size // p, s.hidden_size],
        },
        **_extra_record(spec),
        "steps": planned_steps(spec),
    }


def _extra_record(spec: RunSpec) -> dict:
    """scenario.json keys of the later scenarios (absent for the first four)."""
    out: dict = {}
    if spec.decode_attn_math:
        out["decode_attention"] = {
            "backend": "math",
            "cause": "decode-step F.scaled_dot_product_attention called inside "
            "torch.nn.attention.sdpa_kernel(SDPBackend.MATH); prefill is not",
            "cpu_dispatch_notes": "torch 2.13.0+cpu, bf16 [B, h/p, S, D] with enable_gqa: a float or bool "
            "attn_mask, float32 inputs and head_dim 33 all still dispatch to "
            "aten::_scaled_dot_product_flash_attention_for_cpu; only dropout_p > 0 or an explicit "
            "sdpa_kernel(SDPBackend.MATH) selects aten::_scaled_dot_product_attention_math",
            "prefill_op": "aten::_scaled_dot_product_flash_attention_for_cpu",
            "decode_op": "aten::_scaled_dot_product_attention_math",
        }
    if spec.w4 is not None:
        s, p = spec.shape, spec.tp
        g = spec.w4_group_size
        q_local = s.num_attention_heads // p
        kv_local = kv_heads_per_rank(s.num_key_value_heads, p)
        d = s.head_dim
        shards = {
            "qkv_proj": [(q_local + 2 * kv_local) * d, s.hidden_size],
            "o_proj": [s.hidden_size, q_local * d],
            "gate_up_proj": [2 * s.intermediate_size // p, s.hidden_size],
            "down_proj": [s.hidden_size, s.intermediate_size // p],
        }
        record = {"mode": spec.w4, "quantization_config": awq_quantization_config(g)}
        if spec.w4 == "dense":
            record["applied"] = False
            record["what_runs"] = "aten::linear -> aten::mm on bf16 weights of the full per-rank size"
        elif spec.w4 == "awq":
            record["applied"] = True
            record["what_runs"] = (
                f"steps of >= {AWQ_DEQUANT_TOKENS} tokens: _C::awq_dequantize(qweight, scales, qzeros, 0, 0, 0) -> "
                "bf16 [K, N], then aten::matmul(x, w); smaller steps: _C::awq_gemm(x, qweight, scales, qzeros, 8)"
            )
            record["dequant_convention"] = "w = (q - z) * scale, per group of group_size along K; 8 nibbles an int32"
            record["qweight"] = {name: [k, n // 8] for name, (n, k) in shards.items()}
            record["scales"] = {name: [k // g, n] for name, (n, k) in shards.items()}
            record["qzeros"] = {name: [k // g, n // 8] for name, (n, k) in shards.items()}
        else:
            record["applied"] = True
            record["what_runs"] = (
                "aten::_weight_int4pack_mm_for_cpu(x bf16 [T, K], packed uint8 [N, K/2], group_size, "
                "scales_and_zeros bf16 [K/group_size, N, 2]); packed at load time (outside the profiled "
                "window) by aten::_convert_weight_to_int4pack_for_cpu(int32 [N, K] in 0..15, innerKTiles)"
            )
            record["dequant_convention"] = "w = (q - 8) * scale + zero, per group of group_size along K"
            record["packed_weights"] = {name: [n, k // 2] for name, (n, k) in shards.items()}
            record["scales_and_zeros"] = {name: [k // g, n, 2] for name, (n, k) in shards.items()}
        out["w4"] = record
    if spec.mlp_allreduce_pad_multiple:
        h = spec.shape.hidden_size
        padded = h + (-h % spec.mlp_allreduce_pad_multiple)
        out["padded_mlp_allreduce"] = {
            "hidden_size": h,
            "pad_multiple": spec.mlp_allreduce_pad_multiple,
            "all_reduce_width": padded,
            "extra_bytes_share": round(padded / h - 1, 4),
            "calls_per_step": spec.shape.num_hidden_layers,
            "how": "down_proj output F.pad-ded with zeros to [T, all_reduce_width], all-reduced, sliced to [T, H]",
        }
    if spec.delay_rank is not None:
        out["injected_delay"] = {
            "rank": spec.delay_rank,
            "ms": spec.delay_ms,
            "how": "time.sleep before each decoder-layer all-reduce (o_proj and down_proj) of every decode "
            "step; none in prefill, none before the embedding all-reduce or the logits all-gather",
        }
    if spec.expected_findings:
        out["expected_findings"] = [
            {"rule": rule, "status": status, "what": what} for rule, status, what in spec.expected_findings
        ]
    return out


# ----------------------------------------------------------------------------------------------------------
# The model (runs inside each rank)
# ----------------------------------------------------------------------------------------------------------


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(q_local + 2 kv_local) * D, H]  column-parallel, fused
    o: torch.Tensor  # [H, q_local * D]                   row-parallel
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I/p, H]                    column-parallel, fused
    down: torch.Tensor  # [H, I/p]                         row-parallel
    down_bias_share: torch.Tensor | None = None  # [H] = bias / p (extra_allreduce fault only)
    # w4 == "int4mm": projection name -> (packed uint8 [N, K/2], scales_and_zeros [K/G, N, 2]); packed at load
    int4: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    # w4 == "awq": projection name -> (qweight int32 [K, N/8], scales [K/G, N], qzeros int32 [K/G, N/8])
    awq: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


@dataclass
class RankModel:
    spec: RunSpec
    rank: int
    embed: torch.Tensor  # [V/p, H] vocab-parallel
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [V/p, H] vocab-parallel
    inv_freq: torch.Tensor
    q_local: int
    kv_local: int
    k_cache: list[torch.Tensor] = field(default_factory=list)
    v_cache: list[torch.Tensor] = field(default_factory=list)


def _randn(gen: torch.Generator, *shape: int, std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std


def quantize_int4_packed(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per-group quantization of ``w`` [N, K], packed for aten::_weight_int4pack_mm_for_cpu.

    The op's convention (tinygemm layout, torch 2.13 schema
    ``_weight_int4pack_mm_for_cpu(Tensor self, Tensor mat2, int qGroupSize, Tensor qScaleAndZeros)``):
    ``w = (q - 8) * scale + zero`` with ``q`` in 0..15, ``qScaleAndZeros`` [K/G, N, 2] in the activation
    dtype; ``_convert_weight_to_int4pack_for_cpu(int32 [N, K], innerKTiles)`` packs to uint8 [N, K/2].
    """
    n, k = w.shape
    wg = w.to(torch.float32).view(n, k // group_size, group_size)
    lo = wg.amin(dim=-1, keepdim=True)
    hi = wg.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).view(n, k)
    zero = lo + 8 * scale
    scales_and_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(w.dtype)  # [K/G, N, 2]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
    return packed, scales_and_zeros


AWQ_DEQUANT_TOKENS = 256  # vLLM awq.py: FP16_MATMUL_HEURISTIC_CONDITION = x.shape[:-1].numel() >= 256
AWQ_PACK = 8  # 4-bit values an int32 holds (vLLM's pack_factor, passed to awq_gemm as split_k_iters)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int32 [R, N] in 0..15 -> int32 [R, N/8], value j of each run of 8 in bits 4j..4j+3."""
    r, n = q.shape
    q = q.view(r, n // AWQ_PACK, AWQ_PACK)
    out = torch.zeros(r, n // AWQ_PACK, dtype=torch.int32)
    for j in range(AWQ_PACK):
        out |= q[:, :, j] << (4 * j)
    return out


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 4 * AWQ_PACK, 4, dtype=torch.int32)
    return ((packed[:, :, None] >> shifts) & 0xF).reshape(packed.shape[0], -1)


def awq_pack(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per-group quantization of ``w`` [N, K] (F.linear layout) into AWQ's tensors: qweight int32
    [K, N/8], scales [K/G, N] in w's dtype, qzeros int32 [K/G, N/8]; w = (q - z) * scale."""
    n, k = w.shape
    wg = w.to(torch.float32).t().contiguous().view(k // group_size, group_size, n)
    lo, hi = wg.amin(dim=1, keepdim=True), wg.amax(dim=1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    zero = (-lo / scale).round().clamp(0, 15)
    q = (wg / scale + zero).round().clamp(0, 15).to(torch.int32).view(k, n)
    return _pack_nibbles(q), scale.view(k // group_size, n).to(w.dtype), _pack_nibbles(zero.view(-1, n).to(torch.int32))


def _awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy) -> torch.Tensor:
    k, n = qweight.shape[0], scales.shape[1]
    g = k // scales.shape[0]
    q = _unpack_nibbles(qweight).view(k // g, g, n)
    z = _unpack_nibbles(zeros)[:, None, :]
    return ((q - z).to(scales.dtype) * scales[:, None, :]).view(k, n)


def _awq_gemm(x, qweight, scales, zeros, split_k_iters) -> torch.Tensor:
    # a broadcast multiply and a sum, not a GEMM op: vLLM's fused kernel runs no dense GEMM under it either (a
    # decode step's x is a few rows)
    w = _awq_dequantize(qweight, scales, zeros, 0, 0, 0)
    return (x[:, :, None] * w[None, :, :]).sum(dim=1)


_AWQ_LIBRARY: list = []  # the registration, kept alive for the process


def register_awq_ops() -> None:
    """vLLM's AWQ ops under their names and schemas (csrc/torch_bindings.cpp), with CPU implementations: the
    profiler records `_C::awq_dequantize` and `_C::awq_gemm` as vLLM's CUDA build does."""
    if _AWQ_LIBRARY:
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(
        "awq_gemm(Tensor _in_feats, Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, SymInt split_k_iters) "
        "-> Tensor"
    )
    lib.define(
        "awq_dequantize(Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, SymInt split_k_iters, int thx, "
        "int thy) -> Tensor"
    )
    lib.impl("awq_gemm", _awq_gemm, "CPU")
    lib.impl("awq_dequantize", _awq_dequantize, "CPU")
    _AWQ_LIBRARY.append(lib)


def build_rank_model(spec: RunSpec, rank: int) -> RankModel:
    """Build the full weights from the seed (identical on every rank) and keep this rank's shards."""
    s, p = spec.shape, spec.tp
    dtype = DTYPES[s.torch_dtype]
    gen = torch.Generator().manual_seed(spec.seed)
    h, d, hdim = s.num_attention_heads, s.head_dim, s.hidden_size
    inter, vocab = s.intermediate_size, s.vocab_size
    q_local = h // p
    kv_local = kv_heads_per_rank(s.num_key_value_heads, p)
    kv0, kv1 = kv_head_range(s.num_key_value_heads, p, rank)
    v_rows = slice(rank * vocab // p, (rank + 1) * vocab // p)
    i_rows = slice(rank * inter // p, (rank + 1) * inter // p)
    q_rows = slice(rank * q_local * d, (rank + 1) * q_local * d)
    kv_rows = slice(kv0 * d, kv1 * d)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).contiguous()

    embed = _randn(gen, vocab, hdim, std=1.0)
    layers = []
    for _ in range(s.num_hidden_layers):
        wq = _randn(gen, h * d, hdim, std=hdim**-0.5)
        wk = _randn(gen, s.num_key_value_heads * d, hdim, std=hdim**-0.5)
        wv = _randn(gen, s.num_key_value_heads * d, hdim, std=hdim**-0.5)
        wo = _randn(gen, hdim, h * d, std=(h * d) ** -0.5)
        wg = _randn(gen, inter, hdim, std=hdim**-0.5)
        wu = _randn(gen, inter, hdim, std=hdim**-0.5)
        wd = _randn(gen, hdim, inter, std=inter**-0.5)
        bias = _randn(gen, hdim, std=0.02)
        layers.append(
            LayerWeights(
                input_norm=cast(1.0 + _randn(gen, hdim, std=0.02)),
                qkv=cast(torch.cat([wq[q_rows], wk[kv_rows], wv[kv_rows]], dim=0)),
                o=cast(wo[:, q_rows]),
                post_norm=cast(1.0 + _randn(gen, hdim, std=0.02)),
                gate_up=cast(torch.cat([wg[i_rows], wu[i_rows]], dim=0)),
                down=cast(wd[:, i_rows]),
                down_bias_share=cast(bias / p) if spec.extra_allreduce else None,
            )
        )
    if spec.w4 == "awq":
        for lw in layers:  # the checkpoint's AWQ tensors (load time, outside the profiled window)
            lw.awq = {name: awq_pack(getattr(lw, name), spec.w4_group_size) for name in ("qkv", "o", "gate_up", "down")}
    if spec.w4 == "int4mm":
        # Load time (outside the profiled window), as engines repack checkpoint weights once.
        for lw in layers:
            lw.int4 = {
                name: quantize_int4_packed(getattr(lw, name), spec.w4_group_size)
                for name in ("qkv", "o", "gate_up", "down")
            }
    final_norm = cast(1.0 + _randn(gen, hdim, std=0.02))
    lm_head = _randn(gen, vocab, hdim, std=hdim**-0.5)
    inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    return RankModel(
        spec=spec,
        rank=rank,
        embed=cast(embed[v_rows]),
        layers=layers,
        final_norm=final_norm,
        lm_head=cast(lm_head[v_rows]),
        inv_freq=inv_freq,
        q_local=q_local,
        kv_local=kv_local,
    )


def reset_kv_cache(model: RankModel, num_seqs: int, max_len: int) -> None:
    s = model.spec.shape
    dtype = DTYPES[s.torch_dtype]
    shape = (num_seqs, model.kv_local, max_len, s.head_dim)
    model.k_cache = [torch.zeros(shape, dtype=dtype) for _ in model.layers]
    model.v_cache = [torch.zeros(shape, dtype=dtype) for _ in model.layers]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # vLLM RMSNorm.forward_native: compute in fp32, cast back, scale.
    orig = x.dtype
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return xf.to(orig) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def tp_all_reduce(x: torch.Tensor, fp32: bool) -> torch.Tensor:
    """All-reduce (SUM) a row-parallel partial output over the TP group."""
    if fp32:
        y = x.to(torch.float32)
        dist.all_reduce(y)
        return y.to(x.dtype)
    dist.all_reduce(x)
    return x


def layer_all_reduce(model: RankModel, x: torch.Tensor, decode: bool) -> torch.Tensor:
    """A decoder layer's row-parallel all-reduce; none at p = 1 (vLLM returns the input when TP size is 1)."""
    spec = model.spec
    if spec.tp == 1:
        return x
    if decode and model.rank == spec.delay_rank:
        time.sleep(spec.delay_ms / 1000.0)  # fault: this rank arrives late at the collective
    return tp_all_reduce(x, spec.comm_fp32)


def project(x: torch.Tensor, lw: LayerWeights, name: str, group_size: int) -> torch.Tensor:
    """A projection GEMM: dense ``F.linear`` on the bf16 shard, the int4 packed mm when packed at load, or vLLM's
    AWQ apply (awq.py): dequantize + matmul for a step of >= AWQ_DEQUANT_TOKENS tokens, else the fused gemm."""
    if lw.awq is not None:
        qweight, scales, qzeros = lw.awq[name]
        if x.shape[:-1].numel() >= AWQ_DEQUANT_TOKENS:
            return torch.matmul(x, torch.ops._C.awq_dequantize(qweight, scales, qzeros, 0, 0, 0))
        return torch.ops._C.awq_gemm(x, qweight, scales, qzeros, AWQ_PACK)
    if lw.int4 is not None:
        packed, scales_and_zeros = lw.int4[name]
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)
    return F.linear(x, getattr(lw, name))


def seq_shard(model: RankModel, x: torch.Tensor) -> torch.Tensor:
    """This rank's T/p rows of a [T, H] tensor (Megatron SP splits the sequence dimension)."""
    n = x.shape[0] // model.spec.tp
    return x[model.rank * n : (model.rank + 1) * n]


def sp_reduce_scatter(model: RankModel, x: torch.Tensor) -> torch.Tensor:
    """Sum the [T, H] partial outputs of the ranks and keep this rank's T/p rows."""
    out = torch.empty((x.shape[0] // model.spec.tp, x.shape[1]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


def sp_all_gather(model: RankModel, x: torch.Tensor) -> torch.Tensor:
    """[T/p, H] shards of the ranks -> the full [T, H]."""
    out = torch.empty((x.shape[0] * model.spec.tp, x.shape[1]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def vocab_parallel_embedding(model: RankModel, ids: torch.Tensor) -> torch.Tensor:
    """Megatron VocabParallelEmbedding: look up the local vocab slice, zero the rest, all-reduce."""
    if model.spec.tp == 1:
        return F.embedding(ids, model.embed)
    rows = model.embed.shape[0]
    start, end = model.rank * rows, (model.rank + 1) * rows
    outside = (ids < start) | (ids >= end)
    local = (ids - start).masked_fill(outside, 0)
    out = F.embedding(local, model.embed)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    if model.spec.sequence_parallel:
        return sp_reduce_scatter(model, out)  # [T/p, H]: the residual stream is sequence-parallel
    dist.all_reduce(out)
    return out


def forward(model: RankModel, ids: torch.Tensor, num_seqs: int, start_pos: int) -> torch.Tensor:
    """One forward over ``ids`` ([T] = num_seqs x S tokens, sequence-major). Returns next token ids."""
    spec, s = model.spec, model.spec.shape
    t = ids.shape[0]
    seq = t // num_seqs
    d = s.head_dim
    q_w, kv_w = model.q_local * d, model.kv_local * d
    dtype = DTYPES[s.torch_dtype]
    g = spec.w4_group_size
    decode = seq == 1
    if spec.decode_attn_math and decode:
        # Fault: decode attention forced onto the MATH backend (prefill keeps the flash CPU kernel).
        def math_ctx():
            return sdpa_kernel(SDPBackend.MATH)
    else:
        math_ctx = contextlib.nullcontext

    positions = torch.arange(start_pos, start_pos + seq, dtype=torch.float32)
    freqs = torch.outer(positions, model.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().to(dtype)[None, :, None, :]  # [1, S, 1, D]
    sin = emb.sin().to(dtype)[None, :, None, :]

    sp = spec.sequence_parallel
    hidden = vocab_parallel_embedding(model, ids)  # [T, H], or [T/p, H] with sequence parallelism
    for i, lw in enumerate(model.layers):
        # --- attention block
        x = rms_norm(hidden, lw.input_norm, s.rms_norm_eps)
        if sp:
            x = sp_all_gather(model, x)  # [T/p, H] -> [T, H] before the column-parallel GEMM
        qkv = project(x, lw, "qkv", g)  # column-parallel: [T, (q_local + 2 kv_local) D]
        q, k, v = qkv.split([q_w, kv_w, kv_w], dim=-1)
        q = q.view(num_seqs, seq, model.q_local, d)
        k = k.view(num_seqs, seq, model.kv_local, d)
        v = v.view(num_seqs, seq, model.kv_local, d)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        end = start_pos + seq
        model.k_cache[i][:, :, start_pos:end] = k.transpose(1, 2)
        model.v_cache[i][:, :, start_pos:end] = v.transpose(1, 2)
        with math_ctx():
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                model.k_cache[i][:, :, :end],
                model.v_cache[i][:, :, :end],
                is_causal=seq > 1,
                enable_gqa=model.q_local != model.kv_local,
            )  # [B, q_local, S, D]
        attn = attn.transpose(1, 2).reshape(t, q_w)
        o = project(attn, lw, "o", g)  # row-parallel partial sum: [T, H]
        o = sp_reduce_scatter(model, o) if sp else layer_all_reduce(model, o, decode)
        hidden = hidden + o
        # --- MLP block
        x = rms_norm(hidden, lw.post_norm, s.rms_norm_eps)
        if sp:
            x = sp_all_gather(model, x)
        gate_up = project(x, lw, "gate_up", g)  # column-parallel: [T, 2 I/p]
        gate, up = gate_up.chunk(2, dim=-1)
        mlp = project(F.silu(gate) * up, lw, "down", g)  # row-parallel partial sum: [T, H]
        pad = -s.hidden_size % spec.mlp_allreduce_pad_multiple if spec.mlp_allreduce_pad_multiple else 0
        if pad and not sp:
            # the output of a kernel that works on a padded hidden size: [T, H + pad] all-reduced, then sliced
            mlp = layer_all_reduce(model, F.pad(mlp, (0, pad)), decode)[:, : s.hidden_size]
        else:
            mlp = sp_reduce_scatter(model, mlp) if sp else layer_all_reduce(model, mlp, decode)
        if lw.down_bias_share is not None:
            # Fault: the bias is split across ranks and reduced on its own instead of being added once
            # after the down_proj all-reduce.
            bias = lw.down_bias_share.expand(t, -1).contiguous()
            dist.all_reduce(bias)
            mlp = mlp + bias
        hidden = hidden + mlp

    hidden = rms_norm(hidden, model.final_norm, s.rms_norm_eps)
    if sp:
        hidden = sp_all_gather(model, hidden)  # the logits need every request's last position
    last = hidden.view(num_seqs, seq, -1)[:, -1]  # logits only for the sampled position of each request
    logits_shard = F.linear(last, model.lm_head)  # vocab-parallel: [B, V/p]
    p = spec.tp
    if p == 1:
        return logits_shard.argmax(dim=-1)
    gathered = torch.empty((p * num_seqs, logits_shard.shape[1]), dtype=logits_shard.dtype)
    dist.all_gather_into_tensor(gathered, logits_shard.contiguous())
    logits = gathered.view(p, num_seqs, -1).permute(1, 0, 2).reshape(num_seqs, -1)  # [B, V]
    return logits.argmax(dim=-1)


# ----------------------------------------------------------------------------------------------------------
# Per-rank worker
# ----------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prompts(spec: RunSpec, round_idx: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(spec.seed * 1000 + round_idx)
    return torch.randint(0, spec.shape.vocab_size, (spec.num_seqs, spec.prompt_len), generator=gen)


def _run_round(model: RankModel, spec: RunSpec, prompts: torch.Tensor, on_step) -> list[int]:
    """One prefill step then ``decode_steps`` decode steps. Returns the generated tokens of sequence 0."""
    b, sp = prompts.shape
    reset_kv_cache(model, b, sp + spec.decode_steps + 1)
    with record_function(step_annotation(b, b * sp, 0, 0)):
        nxt = forward(model, prompts.reshape(-1), b, 0)
    on_step()
    out = [int(nxt[0])]
    for k in range(spec.decode_steps):
        with record_function(step_annotation(0, 0, b, b)):
            nxt = forward(model, nxt, b, sp + k)
        on_step()
        out.append(int(nxt[0]))
    return out


def _worker(rank: int, spec: RunSpec, port: int, out_dir: str) -> None:
    # torch 2.13 marks all_gather_into_tensor deprecated (-> all_gather_single); engines still call it.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=spec.tp)
    if spec.w4 == "awq":
        register_awq_ops()
    try:
        model = build_rank_model(spec, rank)
        # Engine warm-up (vLLM's dummy run): a short prefill + decode, not profiled.
        warm = dataclasses.replace(spec, decode_steps=1)
        _run_round(model, warm, _prompts(spec, -1), lambda: None)
        dist.barrier()

        suffix = ".pt.trace.json.gz" if spec.gzip else ".pt.trace.json"
        path = os.path.join(out_dir, f"rank{rank}{suffix}")
        recorded = spec.rounds * (1 + spec.decode_steps)
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            with_stack=False,
            schedule=schedule(wait=0, warmup=1, active=recorded, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(path),
        ) as prof:
            # Profiler warm-up step (collected, then discarded by the schedule): one decode-shaped step.
            reset_kv_cache(model, spec.num_seqs, 2)
            with record_function("profiler_warmup"):
                forward(model, torch.zeros(spec.num_seqs, dtype=torch.long), spec.num_seqs, 0)
            prof.step()
            tokens = []
            for r in range(spec.rounds):
                tokens = _run_round(model, spec, _prompts(spec, r), prof.step)
        if rank == 0:
            print(f"[{spec.name}] rank0 greedy tokens (last round, seq 0): {tokens[:8]}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def generate(spec: RunSpec, out_dir: Path) -> float:
    """Run the scenario; returns wall seconds. Writes traces, config.json and scenario.json."""
    validate(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank*.pt.trace.json*"):
        old.unlink()
    t0 = time.perf_counter()
    mp.spawn(_worker, args=(spec, _free_port(), str(out_dir)), nprocs=spec.tp, join=True)
    elapsed = time.perf_counter() - t0
    (out_dir / "config.json").write_text(json.dumps(hf_config(spec), indent=2) + "\n")
    (out_dir / "scenario.json").write_text(json.dumps(scenario_record(spec), indent=2) + "\n")
    return elapsed


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------


def build_spec(args: argparse.Namespace, name: str) -> RunSpec:
    base = SCENARIOS[name]
    shape_over: dict = {}
    run_over: dict = {}
    if args.large:
        shape_over["num_hidden_layers"] = LARGE_OVERRIDES["num_hidden_layers"]
        run_over["rounds"] = LARGE_OVERRIDES["rounds"]
        run_over["decode_steps"] = LARGE_OVERRIDES["decode_steps"]
    for arg, key in (
        ("layers", "num_hidden_layers"),
        ("hidden", "hidden_size"),
        ("intermediate", "intermediate_size"),
        ("heads", "num_attention_heads"),
        ("kv_heads", "num_key_value_heads"),
        ("vocab", "vocab_size"),
        ("dtype", "torch_dtype"),
    ):
        if getattr(args, arg) is not None:
            shape_over[key] = getattr(args, arg)
    shape = dataclasses.replace(base.shape, **shape_over)
    if args.head_dim is not None:
        shape = dataclasses.replace(shape, head_dim=args.head_dim)
    elif "hidden_size" in shape_over or "num_attention_heads" in shape_over:
        shape = dataclasses.replace(shape, head_dim=shape.hidden_size // shape.num_attention_heads)
    for arg, key in (
        ("tp", "tp"),
        ("decode_steps", "decode_steps"),
        ("rounds", "rounds"),
        ("num_seqs", "num_seqs"),
        ("prompt_len", "prompt_len"),
        ("seed", "seed"),
        ("threads", "threads"),
    ):
        if getattr(args, arg) is not None:
            run_over[key] = getattr(args, arg)
    if args.comm_fp32:
        run_over["comm_fp32"] = True
    if args.extra_allreduce:
        run_over["extra_allreduce"] = True
    if args.no_gzip:
        run_over["gzip"] = False
    if args.decode_attn_math:
        run_over["decode_attn_math"] = True
    if args.w4 is not None:
        run_over["w4"] = None if args.w4 == "none" else args.w4
    if args.w4_group_size is not None:
        run_over["w4_group_size"] = args.w4_group_size
    if args.delay_rank is not None:
        run_over["delay_rank"] = args.delay_rank
    if args.delay_ms is not None:
        run_over["delay_ms"] = args.delay_ms
    if args.sequence_parallel:
        run_over["sequence_parallel"] = True
    return dataclasses.replace(base, shape=shape, **run_over)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="scenario to run")
    ap.add_argument("--out", type=Path, help="output directory (default: sample_traces/<scenario>)")
    ap.add_argument("--all", action="store_true", help="regenerate every committed scenario in place")
    ap.add_argument(
        "--large",
        action="store_true",
        help=f"long run for ingest benchmarks (>=200 MB JSON per rank): {LARGE_OVERRIDES}",
    )
    ap.add_argument("--tp", type=int)
    ap.add_argument("--decode-steps", type=int)
    ap.add_argument("--rounds", type=int, help="prefill+decode rounds recorded")
    ap.add_argument("--num-seqs", type=int)
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    ap.add_argument("--comm-fp32", action="store_true", help="force the fp32-communication fault")
    ap.add_argument("--extra-allreduce", action="store_true", help="force the extra all-reduce fault")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--threads", type=int, help="intra-op threads per rank (default 1)")
    ap.add_argument("--no-gzip", action="store_true", help="write plain .json traces")
    ap.add_argument("--decode-attn-math", action="store_true", help="force decode attention onto SDPA MATH")
    ap.add_argument(
        "--w4", choices=["none", "dense", "int4mm", "awq"], help="4-bit AWQ config: not applied / int4 mm / vLLM AWQ"
    )
    ap.add_argument("--w4-group-size", type=int, help="AWQ group size (32/64/128; must divide per-rank K)")
    ap.add_argument("--delay-rank", type=int, help="rank that sleeps before each decode layer all-reduce")
    ap.add_argument("--delay-ms", type=float, help="that rank's delay in ms")
    ap.add_argument(
        "--sequence-parallel", action="store_true", help="Megatron sequence parallelism (RS + AG per layer)"
    )
    args = ap.parse_args(argv)

    if args.all == bool(args.scenario):
        ap.error("give exactly one of --scenario NAME or --all")
    names = sorted(SCENARIOS) if args.all else [args.scenario]
    if args.all and (args.out or args.large):
        ap.error("--all regenerates the committed scenarios in place; it takes no --out/--large")
    for name in names:
        spec = build_spec(args, name)
        out = args.out if args.out else HERE / name
        elapsed = generate(spec, out)
        sizes = {f.name: f.stat().st_size for f in sorted(out.glob("rank*"))}
        listing = "  ".join(f"{k}={v / 1e6:.2f}MB" for k, v in sizes.items())
        print(f"[{name}] {elapsed:.1f} s -> {out}  {listing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
