"""Kernel and CPU-op name classification.

The patterns live in ``kernel_patterns.json`` next to this file (data, versioned). Each pattern is a
``re.search`` regex over the full name as Kineto or Nsight Systems writes it; the first pattern in
file order that matches wins, so specific patterns come before generic ones. A name no pattern
matches is ``klass="other"``.

For collectives the operation comes from the regex group ``coll`` (normalized with
:func:`normalize_collective_name`) or from the pattern's fixed ``collective_op``.

``families`` in the data file gives each family the name a reader knows it by
(:func:`family_label`: ``pytorch_flash`` -> "FlashAttention-2 (PyTorch SDPA's bundled copy)").

``gemm_precision`` in the data file is an attribute of GEMM kernels, not a class: the arithmetic a GEMM
kernel's name says it runs (fp32 on CUDA cores, TF32 on tensor cores), read by :func:`gemm_precision`.
A name the catalog does not know is classified by the op that launched it (tracediag/derive/attention.py).

The cost of classifying a name is bounded: only its first ``CLASSIFY_MAX_CHARS`` characters are matched
(:func:`classified_part`), so a hostile 500 MiB name costs what a 32 KiB one does. Real names are far shorter
(the longest in the vendored traces and exports: about 5,000 characters); the ingesters count the names that
were classified by their prefix (``names_classified_by_prefix`` in the input's meta).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

# fmt: off
KLASSES = frozenset({
    "attention", "attention_fallback", "gemm", "wo_gemm", "dequant", "collective",
    "memcpy", "memset", "norm", "elementwise", "sync", "conv", "other",
})
COLLECTIVE_OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
    "send_recv", "send", "recv", "barrier", "unknown",
)
# fmt: on
PHASE_HINTS = frozenset({"prefill", "decode", "any", "mixed"})
APPLIES_TO = frozenset({"kernel", "cpu_op"})
_DATA_FILE = "kernel_patterns.json"
CLASSIFY_MAX_CHARS = 32 * 1024  # longest real name seen ≈ 5,000 characters (CUTLASS/CuTe templates)


@dataclass(frozen=True)
class Classification:
    klass: str
    family: str | None
    collective_op: str | None
    pattern_id: str | None
    phase_hint: str | None


@dataclass(frozen=True)
class Pattern:
    id: str
    klass: str
    family: str
    applies_to: frozenset[str]
    regex: re.Pattern[str]
    phase_hint: str
    collective_op: str | None
    source: str
    pos: tuple[str, ...]
    neg: tuple[str, ...]


_OTHER = Classification("other", None, None, None, None)


def _read_data() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8"))


def _build(raw: dict[str, Any]) -> Pattern:
    pid = raw["id"]
    checks = {
        "klass": raw["klass"] in KLASSES,
        "phase_hint": raw["phase_hint"] in PHASE_HINTS,
        "applies_to": bool(raw["applies_to"]) and set(raw["applies_to"]) <= APPLIES_TO,
        "collective_op": raw.get("collective_op") in (None, *COLLECTIVE_OPS),
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"catalog pattern {pid!r}: invalid {', '.join(bad)}")
    return Pattern(
        id=pid,
        klass=raw["klass"],
        family=raw["family"],
        applies_to=frozenset(raw["applies_to"]),
        regex=re.compile(raw["regex"]),
        phase_hint=raw["phase_hint"],
        collective_op=raw.get("collective_op"),
        source=raw["source"],
        pos=tuple(raw["pos"]),
        neg=tuple(raw["neg"]),
    )


@lru_cache(maxsize=1)
def load_patterns() -> tuple[Pattern, ...]:
    """All patterns in file order, regexes compiled (once per process)."""
    patterns = tuple(_build(p) for p in _read_data()["patterns"])
    ids = [p.id for p in patterns]
    if len(set(ids)) != len(ids):
        raise ValueError("catalog pattern ids are not unique")
    return patterns


CATALOG_VERSION: int = int(_read_data()["version"])


# Families given by derivations, not by a name pattern (tracediag/derive/attention.py).
DERIVED_FAMILIES = {"eager_attention": "math attention fallback, eager (matmul → softmax → matmul)"}


@lru_cache(maxsize=1)
def family_labels() -> dict[str, str]:
    """Family id -> the name a reader knows it by (``families`` in the data file, and DERIVED_FAMILIES)."""
    return {fam: entry["label"] for fam, entry in _read_data().get("families", {}).items()} | DERIVED_FAMILIES


def family_label(family: str | None) -> str:
    """Readable name of a catalog family (e.g. ``pytorch_flash`` -> FlashAttention-2, PyTorch's copy)."""
    if family is None:
        return "unclassified"
    return family_labels().get(family, family)


@lru_cache(maxsize=4)
def _patterns_for(kind: str) -> tuple[Pattern, ...]:
    return tuple(p for p in load_patterns() if kind in p.applies_to)


def classified_part(name: str) -> str:
    """The part of a name the patterns are matched against: all of it, or its first CLASSIFY_MAX_CHARS."""
    return name if len(name) <= CLASSIFY_MAX_CHARS else name[:CLASSIFY_MAX_CHARS]


def _classify(name: str, kind: str) -> Classification:
    name = classified_part(name)
    for p in _patterns_for(kind):
        m = p.regex.search(name)
        if m is None:
            continue
        op = None
        if p.klass == "collective":
            coll = m.groupdict().get("coll")
            op = normalize_collective_name(coll) if coll else (p.collective_op or "unknown")
        return Classification(p.klass, p.family, op, p.id, p.phase_hint)
    return _OTHER


@dataclass(frozen=True)
class GemmPrecision:
    id: str
    precision: str  # fp32, tf32
    tensor_cores: bool  # the name says the kernel runs on tensor cores
    regex: re.Pattern[str]
    source: str
    pos: tuple[str, ...]
    neg: tuple[str, ...]


@lru_cache(maxsize=1)
def load_gemm_precision() -> tuple[GemmPrecision, ...]:
    return tuple(
        GemmPrecision(
            id=e["id"],
            precision=e["precision"],
            tensor_cores=bool(e["tensor_cores"]),
            regex=re.compile(e["regex"]),
            source=e["source"],
            pos=tuple(e["pos"]),
            neg=tuple(e["neg"]),
        )
        for e in _read_data().get("gemm_precision", [])
    )


@lru_cache(maxsize=1 << 14)
def gemm_precision(name: str) -> GemmPrecision | None:
    """The arithmetic a GEMM kernel name states (first entry that matches), or None when it says nothing."""
    for e in load_gemm_precision():
        if e.regex.search(name):
            return e
    return None


@lru_cache(maxsize=1 << 16)
def classify_kernel(name: str) -> Classification:
    """Classify a GPU-side event name (kernel, memcpy/memset, sync)."""
    return _classify(name, "kernel")


@lru_cache(maxsize=1 << 16)
def classify_cpu_op(name: str) -> Classification:
    """Classify a host-side name (cpu_op, user_annotation such as nccl:all_reduce, runtime API)."""
    return _classify(name, "cpu_op")


# Collective names as PyTorch writes them, all mapped below (checked in pytorch/pytorch sources):
# - RECORD_PARAM_COMMS "Collective name" in torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (@0007e752 and
#   later): allreduce, allreduce_coalesced, broadcast, _broadcast_oop, reduce, _reduce_oop, all_gather,
#   _allgather_base, allgather_into_tensor_coalesced, reduce_scatter, _reduce_scatter_base,
#   reduce_scatter_tensor_coalesced, all_to_all, all_to_allv, send, recv, gather, scatter, barrier,
#   and "wait" from WorkNCCL::wait (-> unknown).
# - profilingTitle annotations in the same file: nccl:all_reduce, nccl:_all_gather_base, nccl:all_to_all, ...,
#   "nccl:send <rank>-><peer>", "nccl:recv <rank><-<peer>", nccl:coalesced (-> unknown).
# - ProcessGroupGloo.cpp (@0069b729): gloo:all_reduce, gloo:all_to_all, gloo:barrier, gloo:send, gloo:recv,
#   gloo:recvAnySource.
# - c10d dispatcher ops, torch/csrc/distributed/c10d/Ops.cpp TORCH_LIBRARY(c10d) (@018017aa): allreduce_,
#   _allgather_base_, alltoall_base_, recv_any_source_, monitored_barrier_, ...
# gather / scatter have no slot in the op vocabulary and map to "unknown"; so do NCCL "Generic" and "wait".
_OP_KEYS = (
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
)


def normalize_collective_name(s: str) -> str:
    """Map a collective name (Kineto 'Collective name' arg, nccl:/gloo: annotation, c10d op, NCCL kernel
    collective) to one of COLLECTIVE_OPS."""
    parts = s.split()
    head = parts[0] if parts else ""  # "nccl:send 0->1" -> "nccl:send"
    head = head.rsplit("::", 1)[-1].rsplit(":", 1)[-1]  # drop "c10d::" / "nccl:" prefixes
    key = re.sub(r"[^a-z]", "", head.lower())
    for needle, op in _OP_KEYS:
        if needle in key:
            return op
    return "unknown"


__all__ = [
    "CATALOG_VERSION", "CLASSIFY_MAX_CHARS", "COLLECTIVE_OPS", "KLASSES", "Classification", "GemmPrecision",
    "Pattern", "classified_part", "classify_cpu_op", "classify_kernel", "family_label", "family_labels",
    "gemm_precision", "load_gemm_precision", "load_patterns", "normalize_collective_name",
]  # fmt: skip
