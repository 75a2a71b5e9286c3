"""Which weight and activation formats a GEMM kernel (or op) consumes, and whether it is a MoE expert GEMM.

Read from the kernel name where the library prints the element types, else from the catalog pattern that
matched (tracediag/catalog/kernel_patterns.json, whose `note` and `source` say where each name comes from):

- TensorRT-LLM-gen / FlashInfer batched GEMMs `bmm_<out>_<A><B>_...`: element codes E2m1 = FP4 (NVFP4 with
  16-element blocks), MxE2m1 = MXFP4, E4m3 = FP8, MxE4m3 = MXFP8, Bfloat16 / Fp16 = unquantized. When the two
  operands differ, the narrower one is the weight (W4A8, W4A16): no kernel pairs wide weights with narrow
  activations.
- triton_kernels `_[p_]matmul_ogs_<layouts>_<Y>x<X>x<W>_<blocks>` (triton python/triton_kernels
  matmul_ogs_details/_common.py make_matmul_repr: u8 weights print as "mxfp4").
- DeepGEMM `deep_gemm::sm90_fp8_gemm_1d2d_impl<..., (deep_gemm::GemmType)N, ...>`: fp8 / fp4 in the name,
  GemmType 1 / 2 = grouped (MoE), 0 = dense.
- Families whose names carry no element type: the format the library implements (Marlin and Machete:
  weight-only 4- or 8-bit; AWQ, bitsandbytes 4-bit, tinygemm int4: weight-only 4-bit; vLLM CUTLASS
  scaled_mm, cuBLASLt e4m3, hipBLASLt F8: W8A8); `fused_moe_kernel` (Triton): format chosen by constexpr
  flags, not in the name.
Any other GEMM class kernel is a dense 16-bit GEMM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracediag.catalog import classify_cpu_op, classify_kernel


@dataclass(frozen=True)
class KernelFormat:
    weight: str  # "16-bit", "mxfp4", "nvfp4", "fp4", "int4", "fp8", "int8", "low-bit" (width not in the name), "?"
    weight_bits: int | None  # 16, 8, 4; None when low-bit of unknown width or unknown
    act: str  # "16-bit", "fp8", "mxfp8", "nvfp4", "int8", "?"
    act_bits: int | None
    moe: bool  # a grouped / batched expert GEMM
    how: str  # where the format was read from

    @property
    def lowbit(self) -> bool:
        """The kernel reads quantized weights (any width below 16)."""
        return self.weight not in ("16-bit", "?")

    @property
    def scheme(self) -> str:
        w = "W?" if self.weight_bits is None else f"W{self.weight_bits}"
        a = "A?" if self.act_bits is None else f"A{self.act_bits}"
        return f"{w}{a}"

    def matches_bits(self, bits: int | None) -> bool | None:
        """Does this kernel read weights of `bits` bits? None when its name does not tell the width."""
        if bits is None or not self.lowbit:
            return None if bits is None else False
        if self.weight_bits is None:
            return None
        return self.weight_bits == bits


_TRT_CODES = {
    "E2m1": ("nvfp4", 4),
    "MxE2m1": ("mxfp4", 4),
    "E4m3": ("fp8", 8),
    "MxE4m3": ("mxfp8", 8),
    "E5m2": ("fp8", 8),
    "Bfloat16": ("16-bit", 16),
    "Fp16": ("16-bit", 16),
    "Fp32": ("fp32", 32),
}
_TRT_RX = re.compile(
    r"(?:^|\s)[Bb]mm_[A-Za-z0-9]+?_(MxE2m1|MxE4m3|E2m1|E4m3|E5m2|Bfloat16|Fp16|Fp32)(MxE2m1|MxE4m3|E2m1|E4m3|E5m2|Bfloat16|Fp16|Fp32)_"
)
_OGS_TYPES = "mxfp4|mxfp8|fp8e4nv|fp8e4b8|fp8e4b15|fp8e5b16|fp8e5|bf16|fp16|fp32|u8|i8"
_OGS_RX = re.compile(rf"^_(?:p_)?matmul_ogs(?:_acc)?_[NT]{{3}}_({_OGS_TYPES})x({_OGS_TYPES})x({_OGS_TYPES})_")
_OGS = {
    "mxfp4": ("mxfp4", 4),
    "u8": ("mxfp4", 4),
    "mxfp8": ("mxfp8", 8),
    "fp8e4nv": ("fp8", 8),
    "fp8e4b8": ("fp8", 8),
    "fp8e4b15": ("fp8", 8),
    "fp8e5b16": ("fp8", 8),
    "fp8e5": ("fp8", 8),
    "bf16": ("16-bit", 16),
    "fp16": ("16-bit", 16),
    "fp32": ("fp32", 32),
    "i8": ("int8", 8),
}

# Pattern id -> (weight, bits, act, act bits, moe) for names that do not spell their element types.
_BY_PATTERN: dict[str, tuple[str, int | None, str, int | None, bool]] = {
    "marlin": ("low-bit", None, "16-bit", 16, False),
    "marlin_ist": ("int4", 4, "16-bit", 16, False),
    "marlin_24": ("int4", 4, "16-bit", 16, False),
    "marlin_moe": ("low-bit", None, "16-bit", 16, True),
    "machete": ("low-bit", None, "16-bit", 16, False),
    "awq_gemm_cuda": ("int4", 4, "16-bit", 16, False),
    "awq_gemm_triton": ("int4", 4, "16-bit", 16, False),
    "gptq_exllama_gemm": ("low-bit", None, "16-bit", 16, False),
    "exllamav2_gemm": ("low-bit", None, "16-bit", 16, False),
    "exllama_v1_gemm": ("int4", 4, "16-bit", 16, False),
    "bnb_gemv_4bit": ("fp4", 4, "16-bit", 16, False),
    "bnb_gemm_4bit": ("fp4", 4, "16-bit", 16, False),
    "tinygemm_int4": ("int4", 4, "16-bit", 16, False),
    "allspark_w8a16_gemm": ("int8", 8, "16-bit", 16, False),
    "trtllm_fpa_intb_gemm": ("low-bit", None, "16-bit", 16, False),
    "trtllm_weight_only_gemv": ("low-bit", None, "16-bit", 16, False),
    "triton_matmul_ogs_mxfp4": ("mxfp4", 4, "16-bit", 16, True),
    "triton_p_matmul_ogs_mxfp4": ("mxfp4", 4, "16-bit", 16, True),
    "triton_fused_moe_gptq_awq": ("low-bit", None, "16-bit", 16, True),
    "triton_fused_moe": ("?", None, "?", None, True),
    "cutlass_moe_gemm": ("?", None, "?", None, True),
    "dpsk_grouped_gemm": ("fp8", 8, "fp8", 8, True),  # DeepSeek's fp8_ptp128c grouped expert GEMM
    "vllm_cutlass_scaled_mm": ("fp8", 8, "fp8", 8, False),
    "cublas_fp8_xmma": ("fp8", 8, "fp8", 8, False),
    "cublaslt_nvjet_fp8": ("fp8", 8, "fp8", 8, False),
    "hipblaslt_fp8": ("fp8", 8, "fp8", 8, False),
    "ck_moe_gemm": ("?", None, "?", None, True),
    "aiter_fmoe_asm": ("?", None, "?", None, True),
    "aiter_asm_gemm": ("?", None, "?", None, False),
    "deepgemm": ("fp8", 8, "fp8", 8, False),
    # CPU ops (CPU-only traces: the op stands for its kernels)
    "marlin_ops": ("low-bit", None, "16-bit", 16, False),
    "machete_ops": ("low-bit", None, "16-bit", 16, False),
    "awq_gemm_op": ("int4", 4, "16-bit", 16, False),
    "gptq_gemm_op": ("low-bit", None, "16-bit", 16, False),
    "bnb_gemm_ops": ("fp4", 4, "16-bit", 16, False),
    "int4pack_mm_op": ("int4", 4, "16-bit", 16, False),
    "mslk_int4_ops": ("int4", 4, "16-bit", 16, False),
    "moe_gemm_ops": ("?", None, "?", None, True),
    "quant_gemm_ops": ("?", None, "?", None, False),
}
_GEMM_KLASSES = ("gemm", "wo_gemm")
# element types in kernel names: CUTLASS float_e4m3_t / e4m3, cuBLASLt e4m3, Triton fp8e4nv, c10 Float8_e4m3fn
_FP8_WORDS = re.compile(r"e4m3|e5m2|float8|fp8")
_FP4_WORDS = re.compile(r"e2m1|fp4")


def _refine(pid: str, name: str, base: tuple[str, int | None, str, int | None, bool]) -> tuple:
    w, wb, a, ab, moe = base
    low = name.lower()
    if pid == "vllm_cutlass_scaled_mm" and "int8" in low:
        return ("int8", 8, "int8", 8, moe)
    if pid == "deepgemm":
        g = re.search(r"\((?:deep_gemm|dpsk::gemm)::GemmType\)(\d)", name)  # DeepSeek's own build: dpsk::gemm
        moe = bool(g and g.group(1) != "0")
        if "fp8_fp4" in low:
            return ("fp4", 4, "fp8", 8, moe)
        if "fp4_gemm" in low:
            return ("fp4", 4, "fp4", 4, moe)
        return (w, wb, a, ab, moe)
    if pid in ("ck_moe_gemm", "cutlass_moe_gemm", "aiter_fmoe_asm", "aiter_asm_gemm", "quant_gemm_ops", "moe_gemm_ops"):
        if (
            "mxfp4" in low
            or "f4gemm" in low
            or "per1x32fp4" in low
            or "float_e2m1" in low
            or "pk_fp4" in low
            or "a4w4" in low
        ):
            return (
                "mxfp4",
                4,
                "mxfp4" if ("a4w4" in low or "f4gemm" in low) else "?",
                4 if "a4w4" in low or "f4gemm" in low else None,
                moe,
            )
        if "wfp4" in low:
            return ("mxfp4", 4, "16-bit", 16, moe)
        if "pk_i4" in low or "int4" in low:
            return ("int4", 4, "16-bit", 16, moe)
        if "f8" in low or "fp8" in low or "e4m3" in low or "a8w8" in low:
            return ("fp8", 8, "fp8", 8, moe)
        if "i8gemm" in low or "int8" in low:
            return ("int8", 8, "int8", 8, moe)
        if "bf16gemm" in low or "bfloat16" in low or "bf16" in low:
            return ("16-bit", 16, "16-bit", 16, moe)
    return (w, wb, a, ab, moe)


def kernel_format(name: str, source: str = "gpu_kernel") -> KernelFormat | None:
    """Format of a GEMM-class kernel (or CPU op); None for names that are not GEMMs."""
    c = classify_kernel(name) if source == "gpu_kernel" else classify_cpu_op(name)
    if c.klass not in _GEMM_KLASSES:
        return None
    m = _TRT_RX.search(name)
    if m:
        (f1, b1), (f2, b2) = _TRT_CODES[m.group(1)], _TRT_CODES[m.group(2)]
        (w, wb), (a, ab) = ((f1, b1), (f2, b2)) if b1 <= b2 else ((f2, b2), (f1, b1))
        return KernelFormat(w, wb, a, ab, True, f"element codes {m.group(1)}×{m.group(2)} in the name")
    m = _OGS_RX.search(name)
    if m:
        (a, ab), (w, wb) = _OGS[m.group(2)], _OGS[m.group(3)]
        return KernelFormat(w, wb, a, ab, True, f"triton_kernels matmul_ogs dtypes X={m.group(2)}, W={m.group(3)}")
    pid = c.pattern_id or ""
    if pid in _BY_PATTERN:
        w, wb, a, ab, moe = _refine(pid, name, _BY_PATTERN[pid])
        how = f"catalog pattern {pid}" + ("" if w != "?" else " (format not in the name)")
        return KernelFormat(w, wb, a, ab, moe, how)
    if c.klass == "wo_gemm":
        return KernelFormat("low-bit", None, "16-bit", 16, False, f"catalog class wo_gemm ({pid})")
    low = name.lower()
    if _FP8_WORDS.search(low):  # a generic GEMM pattern caught an FP8 kernel (CUTLASS / cuBLASLt e4m3 names)
        return KernelFormat("fp8", 8, "fp8", 8, False, f"FP8 element type in the name ({pid or c.family})")
    if _FP4_WORDS.search(low):
        return KernelFormat("fp4", 4, "?", None, False, f"FP4 element type in the name ({pid or c.family})")
    return KernelFormat("16-bit", 16, "16-bit", 16, False, f"dense GEMM ({pid or c.family})")
