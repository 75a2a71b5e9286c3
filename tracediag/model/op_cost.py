"""Per-op cost model: the FLOPs and bytes one call of a CPU op asks of the GPU, from its name, input dims and dtypes.

Pure functions of what a Kineto trace records per op with ``record_shapes=True`` (``Input Dims``, ``Input type``;
optionally ``Concrete Inputs``, the scalar arguments, which the store does not keep today). An op this module does
not know, or a call whose shapes do not fit the op's signature, gets no cost (``None``): never a guess. The
formulas count the op's compulsory work: every multiply-add of its definition and every byte it must read from
and write to GPU memory once, at the element size of the dtype the trace records (tracediag.model.dtypes). They
are the "speed of light" of the call: a kernel re-reading tiles from memory, or padding a tile, does more.

Notation: ``s(x)`` the element size of tensor x in bytes, ``|x|`` its element count. docs/method.md ("Per-op cost
model") gives each formula's source.

GEMMs (FLOPs: a multiply-add is 2 FLOPs; bytes: read A, B and any bias or scale once, write C once)

- ``aten::mm(A[M,K], B[K,N])``: FLOPs ``2·M·N·K``; bytes ``(M·K + K·N + M·N)·s``.
- ``aten::addmm(bias, A[M,K], B[K,N])`` (out = β·bias + α·A·B): FLOPs ``2·M·N·K + M·N`` (the bias add);
  bytes ``(M·K + K·N + |bias| + M·N)·s`` (``|bias|`` is N for a row bias, M·N for a full one).
- ``aten::bmm(A[b,M,K], B[b,K,N])``: FLOPs ``2·b·M·N·K``; bytes ``b·(M·K + K·N + M·N)·s``.
- ``aten::baddbmm(self, A[b,M,K], B[b,K,N])``: FLOPs ``2·b·M·N·K + b·M·N``; bytes
  ``(b·M·K + b·K·N + |self| + b·M·N)·s``.
- ``aten::matmul(A, B)``: the batched product of ``torch.matmul`` (a 1-D A is [1,K], a 1-D B is [K,1], the batch
  dims broadcast to ``batch``): FLOPs ``2·batch·M·N·K``; bytes ``(|A| + |B| + batch·M·N)·s``.
- ``aten::linear(x[...,K], W[N,K], bias[N]?)``, with ``M = |x| / K``: FLOPs ``2·M·N·K`` (``+ M·N`` with a bias);
  bytes ``(M·K + N·K + N + M·N)·s`` (no N without a bias).
- ``aten::_scaled_mm(A[M,K], B[K,N], scale_a, scale_b, bias?, ...)`` (fp8): FLOPs ``2·M·N·K + M·N`` (the
  scaling of each output by scale_a·scale_b) ``+ M·N`` more when a scale is per row or column (one multiply per
  scale) ``+ M·N`` with a bias; bytes ``M·K·s(A) + K·N·s(B) + |scale_a|·s + |scale_b|·s + |bias|·s(bias) +
  M·N·s(out)``. The output dtype is the bias's; without a bias it is ``out_dtype``, a scalar argument the store
  does not keep, so the bytes (not the FLOPs) are unknown.

Attention (FLOPs: the two matmuls of softmax(Q·Kᵀ·scale)·V; bytes: read Q, K, V (and a mask or bias), write O)

- SDPA backends, Q[B,Hq,Sq,D], K[B,Hkv,Sk,D], V[B,Hkv,Sk,Dv]: ``aten::_scaled_dot_product_flash_attention``,
  ``aten::_scaled_dot_product_efficient_attention``, ``aten::_scaled_dot_product_cudnn_attention``; and the
  kernels' own ops they call, Q[B,Sq,Hq,D]: ``aten::_flash_attention_forward``,
  ``aten::_efficient_attention_forward``. FLOPs ``2·B·Hq·Sq·Sk·D + 2·B·Hq·Sq·Sk·Dv`` (Q·Kᵀ, then P·V); with causal
  masking only the scores on and below the diagonal are computed, half of them: ``×½``. Hq ≠ Hkv (GQA) reads
  each K/V head once. Bytes ``(|Q| + |K| + |V| + |O|)·s + |mask|·s(mask)``, with ``|O| = B·Hq·Sq·Dv``; the flash
  ops also write their log-sum-exp, ``B·Hq·Sq`` fp32. The softmax's exp, max and sum (a few FLOPs per score, on
  the vector units, not the tensor cores whose peak is the roof) are not counted.
- The causal flag is a scalar argument ('Concrete Inputs'): ``causal_flag`` reads it when given. Without it the
  full score work is counted (an upper bound, twice a causal call's) and the cost says the flag is unknown.
  Varlen calls (``cum_seq_q`` given: Q is [total, H, D]) have per-sequence lengths the dims do not give: no cost.

Memory-bound ops (bytes only: FLOPs are not counted, ``flops`` is None and the op is memory-bound by definition)

- Elementwise and activations (``aten::add``, ``mul``, ``silu``, ``gelu``, ``pow``, ``where``, ``copy_`` ... and
  their in-place ``_`` forms): bytes ``Σ |xᵢ|·s(xᵢ) + |out|·s(out)`` over the tensor inputs with at least one
  dim, ``out`` their broadcast shape (the first input for an in-place op, the destination for ``copy_``) at the
  promoted dtype (bool for comparisons). 0-dim inputs (wrapped Python numbers) are passed by value: not counted.
- ``aten::fill_``, ``zero_``: bytes ``|self|·s`` (written only). ``aten::clone``: ``2·|x|·s``.
- Normalisation, ``aten::native_layer_norm(x, shape, w?, b?)``: bytes ``2·|x|·s(x) + |w|·s + |b|·s + 2·R·4``
  (read x, write y, the saved mean and rstd, R = |x| / |w| rows, fp32); ``aten::_fused_rms_norm(x, shape, w)``:
  ``2·|x|·s(x) + |w|·s + R·4``. The normalised size comes from the weight; without one it is unknown: no cost.
- Reductions (``aten::sum``, ``mean``, ``amax``, ``max``, ``argmax``, ``var``, ``norm`` ...): bytes ``|x|·s(x)``,
  the read. The write, ``|x|`` divided by the extent of the reduced dims, is not counted: the reduced dims are a
  scalar argument the store does not keep (under 2 % of the bytes when that extent is at least 50).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from tracediag.model.dtypes import canonical_dtype, element_size

GEMM = "gemm"
ATTENTION = "attention"
MEMORY = "memory"

CAUSAL_UNKNOWN = "causal flag not recorded: the full score work is counted (a causal call does half)"
_MAX_DIM = 1 << 40  # larger is not a tensor dim (hostile or corrupt input): no cost


@dataclass(frozen=True)
class OpCost:
    """One call's compulsory work. `flops` None: not counted (memory-bound ops) or unknown; `bytes` None: unknown."""

    kind: str  # GEMM, ATTENTION or MEMORY: which formula family (module docstring)
    flops: float | None
    bytes: float | None
    dtype: str | None  # canonical dtype of the op's tensor inputs, in input order, distinct: 'bf16', 'fp32,bf16'
    causal: bool | None = None  # attention only: the causal flag when recorded
    note: str | None = None  # what the formula could not see


@dataclass(frozen=True)
class _T:
    """One tensor input: dims and dtype (canonical name, element size)."""

    dims: tuple[int, ...]
    dtype: str
    size: int

    @property
    def numel(self) -> int:
        return math.prod(self.dims)


# --- parsing what the trace records ---------------------------------------------------------------------------


def _dims(v: Any) -> tuple[int, ...] | None:
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        return None
    if any(d < 0 or d > _MAX_DIM for d in v):
        return None
    return tuple(v)


def _inputs(dims: Any, types: Any) -> list[_T | None] | None:
    """Per input position: the tensor (dims + a known dtype) or None (a scalar, a list, an absent optional)."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    out: list[_T | None] = []
    for d, t in zip(dims, types):
        shape = _dims(d)
        canon = canonical_dtype(t) if isinstance(t, str) else None
        size = element_size(t) if canon else None
        out.append(_T(shape, canon, size) if shape is not None and canon and size else None)
    return out


def parse_json(text: str | None) -> Any:
    """A verbatim JSON fragment of the store (cpu_ops.input_dims / input_types) -> Python, None when unreadable."""
    if not text:
        return None
    try:
        return orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return None


def shape_text(dims: Any) -> str | None:
    """Compact JSON of the recorded input dims (the `shape` key of op_roofline): '[[48,256],[768,256]]'."""
    if dims is None:
        return None
    try:
        return orjson.dumps(dims).decode()
    except TypeError:
        return None


def dtype_text(dims: Any, types: Any) -> str | None:
    """The distinct canonical dtypes of the tensor inputs, in input order, comma-joined ('bf16', 'fp32,bf16')."""
    ins = _inputs(dims, types)
    if not ins:
        return None
    seen: list[str] = []
    for t in ins:
        if t is not None and t.dtype not in seen:
            seen.append(t.dtype)
    return ",".join(seen) or None


# --- GEMMs ----------------------------------------------------------------------------------------------------


def _mm(a: _T, b: _T, extra_flops: float = 0.0, extra_bytes: float = 0.0) -> tuple[float, float] | None:
    if len(a.dims) != 2 or len(b.dims) != 2 or a.dims[1] != b.dims[0]:
        return None
    (m, k), n = a.dims, b.dims[1]
    return 2.0 * m * n * k + extra_flops, float(m * k * a.size + k * n * b.size + m * n * a.size) + extra_bytes


def _bmm(a: _T, b: _T) -> tuple[int, int, int, int] | None:
    if len(a.dims) != 3 or len(b.dims) != 3 or a.dims[0] != b.dims[0] or a.dims[2] != b.dims[1]:
        return None
    return a.dims[0], a.dims[1], b.dims[2], a.dims[2]  # batch, M, N, K


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy/PyTorch broadcasting of shapes; None when they do not broadcast."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        sizes = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _gemm(name: str, ins: list[_T | None]) -> tuple[float, float] | None:
    t = ins + [None] * 4
    if name == "aten::mm" and t[0] and t[1]:
        return _mm(t[0], t[1])
    if name == "aten::addmm" and t[0] and t[1] and t[2]:
        a, b, bias = t[1], t[2], t[0]
        if (
            len(a.dims) == 2
            and len(b.dims) == 2
            and _broadcast(bias.dims, (a.dims[0], b.dims[1])) == (a.dims[0], b.dims[1])
        ):
            return _mm(a, b, a.dims[0] * b.dims[1], bias.numel * bias.size)
        return None
    if name in ("aten::bmm", "aten::baddbmm"):
        a, b, self_ = (t[0], t[1], None) if name == "aten::bmm" else (t[1], t[2], t[0])
        if a is None or b is None or (name == "aten::baddbmm" and self_ is None):
            return None
        shp = _bmm(a, b)
        if shp is None:
            return None
        bat, m, n, k = shp
        flops = 2.0 * bat * m * n * k + (bat * m * n if self_ else 0)
        nbytes = bat * (m * k * a.size + k * n * b.size + m * n * a.size) + (self_.numel * self_.size if self_ else 0)
        return flops, float(nbytes)
    if name == "aten::matmul" and t[0] and t[1]:
        return _matmul(t[0], t[1])
    if name == "aten::linear" and t[0] and t[1]:
        x, w, bias = t[0], t[1], t[2]
        if len(x.dims) < 1 or len(w.dims) != 2 or x.dims[-1] != w.dims[1]:
            return None
        k, n = w.dims[1], w.dims[0]
        m = x.numel // k if k else 0
        flops = 2.0 * m * n * k + (m * n if bias else 0)
        nbytes = m * k * x.size + n * k * w.size + (bias.numel * bias.size if bias else 0) + m * n * x.size
        return flops, float(nbytes)
    return None


def _matmul(a: _T, b: _T) -> tuple[float, float] | None:
    if not a.dims or not b.dims:
        return None
    ad = (1, *a.dims) if len(a.dims) == 1 else a.dims
    bd = (*b.dims, 1) if len(b.dims) == 1 else b.dims
    if ad[-1] != bd[-2]:
        return None
    batch_shape = _broadcast(ad[:-2], bd[:-2])
    if batch_shape is None:
        return None
    bat, m, k, n = math.prod(batch_shape), ad[-2], ad[-1], bd[-1]
    return 2.0 * bat * m * n * k, float(a.numel * a.size + b.numel * b.size + bat * m * n * a.size)


def _scaled_mm(ins: list[_T | None]) -> tuple[float, float | None, str | None] | None:
    t = ins + [None] * 6
    a, b, sa, sb, bias = t[0], t[1], t[2], t[3], t[4]
    if a is None or b is None or sa is None or sb is None or len(a.dims) != 2 or len(b.dims) != 2:
        return None
    if a.dims[1] != b.dims[0]:
        return None
    (m, k), n = a.dims, b.dims[1]
    per_row = sa.numel > 1 or sb.numel > 1
    flops = 2.0 * m * n * k + m * n * (2 if per_row else 1) + (m * n if bias else 0)
    if bias is None:
        return flops, None, "output dtype (out_dtype, a scalar argument) not recorded: bytes unknown"
    nbytes = m * k * a.size + k * n * b.size + sa.numel * sa.size + sb.numel * sb.size
    nbytes += bias.numel * bias.size + m * n * bias.size
    return flops, float(nbytes), None


# --- attention ------------------------------------------------------------------------------------------------

# op -> (layout of q/k/v: "bhsd" or "bshd", index of the mask/bias input or None, writes a log-sum-exp)
_ATTENTION: dict[str, tuple[str, int | None, bool]] = {
    "aten::_scaled_dot_product_flash_attention": ("bhsd", None, True),
    "aten::_scaled_dot_product_efficient_attention": ("bhsd", 3, False),
    "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 3, False),
    "aten::_flash_attention_forward": ("bshd", None, True),
    "aten::_efficient_attention_forward": ("bshd", 3, False),
}
# op -> position of the causal flag among its arguments ('Concrete Inputs'), from the ops' schemas in
# aten/src/ATen/native/native_functions.yaml; _efficient_attention_forward's is custom_mask_type (0 = none)
_CAUSAL_ARG = {
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_flash_attention_forward": 8,
    "aten::_efficient_attention_forward": 9,
}
_VARLEN_ARG = {"aten::_flash_attention_forward": 3, "aten::_efficient_attention_forward": 4}  # cum_seq_q


def causal_flag(name: str, concrete_inputs: Any) -> bool | None:
    """The causal flag of an attention call from its 'Concrete Inputs' (the scalar arguments as text: "True",
    "False", or for _efficient_attention_forward custom_mask_type "0"/"1"/"2"); None when not recorded."""
    pos = _CAUSAL_ARG.get(name)
    if pos is None or not isinstance(concrete_inputs, list) or len(concrete_inputs) <= pos:
        return None
    v = concrete_inputs[pos]
    if not isinstance(v, str):
        return None
    v = v.strip()
    if v in ("True", "true", "1", "2"):
        return True
    if v in ("False", "false", "0"):
        return False
    return None


def _attention(name: str, ins: list[_T | None], causal: bool | None) -> tuple[float, float] | None:
    layout, mask_at, lse = _ATTENTION[name]
    t = ins + [None] * 6
    q, k, v = t[0], t[1], t[2]
    if q is None or k is None or v is None or not (len(q.dims) == len(k.dims) == len(v.dims) == 4):
        return None
    varlen = _VARLEN_ARG.get(name)
    if varlen is not None and t[varlen] is not None:
        return None  # per-sequence lengths: not in the dims
    if layout == "bhsd":
        (b, hq, sq, d), (bk, hkv, sk, dk), (bv, hv, skv, dv) = q.dims, k.dims, v.dims
    else:
        (b, sq, hq, d), (bk, sk, hkv, dk), (bv, skv, hv, dv) = q.dims, k.dims, v.dims
    if b != bk or b != bv or d != dk or sk != skv or hkv != hv or hkv == 0 or hq % hkv:
        return None
    flops = 2.0 * b * hq * sq * sk * (d + dv) * (0.5 if causal else 1.0)
    out = b * hq * sq * dv
    nbytes = q.numel * q.size + k.numel * k.size + v.numel * v.size + out * q.size
    if lse:
        nbytes += b * hq * sq * 4
    if mask_at is not None and t[mask_at] is not None:
        nbytes += t[mask_at].numel * t[mask_at].size
    return flops, float(nbytes)


# --- memory-bound ops -----------------------------------------------------------------------------------------

_UNARY = ("abs", "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "silu",
          "gelu", "relu", "clamp", "clamp_min", "clamp_max", "pow", "erf", "sign", "floor", "ceil", "round",
          "hardtanh", "leaky_relu", "exp2", "log1p", "expm1", "square")  # fmt: skip
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "where", "masked_fill", "remainder", "fmod", "rsub",
           "threshold_backward", "lerp", "addcmul", "addcdiv", "floor_divide", "bitwise_and", "bitwise_or",
           "logical_and", "logical_or", "logical_not")  # fmt: skip
_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf")
_REDUCE = ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "norm", "prod", "any",
           "all", "linalg_vector_norm", "logsumexp")  # fmt: skip
_FLOAT_RANK = {"fp64": 3, "fp32": 2, "fp16": 1, "bf16": 1, "fp8_e4m3": 0, "fp8_e5m2": 0}


def _elementwise_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for base in _UNARY + _BINARY:
        names[f"aten::{base}"] = "elementwise"
        names[f"aten::{base}_"] = "inplace"
    for base in _COMPARE:
        names[f"aten::{base}"] = "compare"
        names[f"aten::{base}_"] = "inplace"
    for base in _REDUCE:
        names[f"aten::{base}"] = "reduce"
    names.update({"aten::copy_": "copy", "aten::clone": "clone", "aten::fill_": "fill", "aten::zero_": "fill"})
    names.update({"aten::native_layer_norm": "layer_norm", "aten::_fused_rms_norm": "rms_norm"})
    return names


_MEMORY = _elementwise_names()


def _promote(ts: list[_T]) -> tuple[str, int] | None:
    """The result dtype of tensors of these dtypes (torch.result_type for dimensioned tensors): a float beats an
    integer, a wider float a narrower one, fp16 with bf16 gives fp32; None when it cannot be told."""
    floats = {t.dtype: t.size for t in ts if t.dtype in _FLOAT_RANK}
    if floats:
        top = max(_FLOAT_RANK[k] for k in floats)
        widest = [k for k in floats if _FLOAT_RANK[k] == top]
        if set(widest) == {"fp16", "bf16"}:
            return "fp32", 4
        return (widest[0], floats[widest[0]]) if len(widest) == 1 else None  # two fp8 kinds: not said
    if any(t.dtype == "bool" for t in ts) and all(t.dtype == "bool" for t in ts):
        return "bool", 1
    ints = [t for t in ts if t.dtype != "bool"]
    if not ints:
        return None
    best = max(ints, key=lambda t: t.size)
    return best.dtype, best.size


def _memory(name: str, ins: list[_T | None]) -> tuple[float | None, str | None]:
    kind = _MEMORY[name]
    tensors = [t for t in ins if t is not None and t.dims]
    first = ins[0] if ins else None
    if kind in ("fill", "clone", "reduce"):
        if first is None:
            return None, None
        if kind == "fill":
            return float(first.numel * first.size), None
        if kind == "clone":
            return float(2 * first.numel * first.size), None
        return float(first.numel * first.size), "write not counted (reduced dims not recorded)"
    if kind == "copy":
        src = ins[1] if len(ins) > 1 else None
        if first is None or src is None or _broadcast(src.dims, first.dims) != first.dims:
            return None, None
        return float(first.numel * first.size + src.numel * src.size), None
    if kind in ("layer_norm", "rms_norm"):
        w = ins[2] if len(ins) > 2 else None
        bias = ins[3] if kind == "layer_norm" and len(ins) > 3 else None
        if first is None or w is None or not w.numel or first.numel % w.numel:
            return None, None
        rows = first.numel // w.numel
        nbytes = 2 * first.numel * first.size + w.numel * w.size + (bias.numel * bias.size if bias else 0)
        return float(nbytes + rows * 4 * (2 if kind == "layer_norm" else 1)), None
    if not tensors:
        return None, None
    if kind == "inplace":
        if first is None or not first.dims:
            return None, None
        out_dims, out_size = first.dims, first.size
        if _broadcast(*(t.dims for t in tensors)) != out_dims:
            return None, None
    else:
        shape = _broadcast(*(t.dims for t in tensors))
        res = ("bool", 1) if kind == "compare" else _promote(tensors)
        if shape is None or res is None:
            return None, None
        if (
            kind != "compare"
            and res[0] not in _FLOAT_RANK
            and any(t is not None and not t.dims and t.dtype in _FLOAT_RANK for t in ins)
        ):
            return None, None  # an integer tensor with a float number: promoted to the default float, not said
        out_dims, out_size = shape, res[1]
    reads = sum(t.numel * t.size for t in tensors)
    return float(reads + math.prod(out_dims) * out_size), None


# --- the entry point ------------------------------------------------------------------------------------------


def known(name: str) -> bool:
    """Whether the cost model has a formula for the op."""
    return name in _MEMORY or name in _ATTENTION or name in _GEMM_OPS


_GEMM_OPS = frozenset(("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                       "aten::_scaled_mm"))  # fmt: skip


def op_cost(name: str, dims: Any, types: Any, concrete_inputs: Any = None) -> OpCost | None:
    """FLOPs and bytes of one call of `name` with these recorded input dims and types (parsed JSON lists, as the
    trace's 'Input Dims' / 'Input type'), or None: an op the model does not know, or a call whose dims and types
    do not fit its signature (the module docstring gives every formula)."""
    if not known(name):
        return None
    ins = _inputs(dims, types)
    if not ins:
        return None
    dtype = dtype_text(dims, types)
    if name in _GEMM_OPS:
        if name == "aten::_scaled_mm":
            got = _scaled_mm(ins)
            return None if got is None else OpCost(GEMM, got[0], got[1], dtype, note=got[2])
        fb = _gemm(name, ins)
        return None if fb is None else OpCost(GEMM, fb[0], fb[1], dtype)
    if name in _ATTENTION:
        causal = causal_flag(name, concrete_inputs)
        fb = _attention(name, ins, causal)
        if fb is None:
            return None
        return OpCost(ATTENTION, fb[0], fb[1], dtype, causal, None if causal is not None else CAUSAL_UNKNOWN)
    nbytes, note = _memory(name, ins)
    return None if nbytes is None else OpCost(MEMORY, None, nbytes, dtype, note=note)


# op family of a memory-bound op's formula kind: the rows of the report's "buyable time" table and KRN012's unit
_MEMORY_FAMILY = {"elementwise": "elementwise", "inplace": "elementwise", "compare": "elementwise",
                  "reduce": "reduction", "copy": "copy / fill", "clone": "copy / fill", "fill": "copy / fill",
                  "layer_norm": "normalisation", "rms_norm": "normalisation"}  # fmt: skip


def family(name: str) -> str | None:
    """The op family of a CPU op the cost model knows: 'GEMM', 'attention', 'elementwise', 'reduction',
    'normalisation' or 'copy / fill'; None for an op it does not know."""
    if name in _GEMM_OPS:
        return "GEMM"
    if name in _ATTENTION:
        return "attention"
    kind = _MEMORY.get(name)
    return _MEMORY_FAMILY[kind] if kind else None


def op_cost_json(name: str, dims_json: str | None, types_json: str | None) -> OpCost | None:
    """op_cost of a call as the store keeps it (cpu_ops.input_dims / input_types: verbatim JSON text)."""
    return op_cost(name, parse_json(dims_json), parse_json(types_json))
