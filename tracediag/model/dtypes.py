"""Element types as profilers spell them -> one canonical short name and its size in bytes.

Sources of the spellings: c10 ScalarType names in record_param_comms `dtype`
(c10/core/ScalarType.h: "Float", "BFloat16", ...), C++ type names in Kineto `Input type`
("float", "c10::BFloat16", "long int", ...), NCCL kernel-name suffixes ("float", "__nv_bfloat16",
"bf16", "f32", ...) and Hugging Face `torch_dtype` strings.
"""

from __future__ import annotations

_CANON: dict[str, tuple[str, int]] = {}


def _add(canon: str, size: int, *spellings: str) -> None:
    for s in (canon, *spellings):
        _CANON[s.lower()] = (canon, size)


_add("fp32", 4, "float", "float32", "c10::float", "f32", "torch.float32")
_add("fp64", 8, "double", "float64", "f64", "torch.float64")
_add("fp16", 2, "half", "float16", "c10::half", "f16", "__half", "torch.float16")
_add("bf16", 2, "bfloat16", "c10::bfloat16", "__nv_bfloat16", "__hip_bfloat16", "torch.bfloat16")
_add("fp8_e4m3", 1, "float8_e4m3fn", "c10::float8_e4m3fn", "f8e4m3", "float8_e4m3fnuz", "c10::float8_e4m3fnuz")
_add("fp8_e5m2", 1, "float8_e5m2", "c10::float8_e5m2", "f8e5m2", "float8_e5m2fnuz", "c10::float8_e5m2fnuz")
_add("int8", 1, "char", "signed char", "int8_t", "i8", "qint8", "c10::qint8")
_add("uint8", 1, "byte", "unsigned char", "uint8_t", "u8", "quint8", "c10::quint8")
_add("int16", 2, "short", "short int", "i16")
_add("int32", 4, "int", "int32_t", "i32", "u32", "uint32", "uint32_t", "qint32", "c10::qint32")
_add("int64", 8, "long", "long int", "long long", "int64_t", "i64", "u64", "uint64", "uint64_t")
_add("bool", 1)


def canonical_dtype(name: str | None) -> str | None:
    if not name:
        return None
    hit = _CANON.get(name.strip().lower())
    return hit[0] if hit else None


def element_size(name: str | None) -> int | None:
    if not name:
        return None
    hit = _CANON.get(name.strip().lower())
    return hit[1] if hit else None
