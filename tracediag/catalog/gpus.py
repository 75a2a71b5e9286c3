"""GPU catalogue: dense peak TFLOP/s per math class and memory bandwidth, each number with its source.

The numbers live in ``gpus.json`` next to this file (data, versioned): for every GPU its dense peaks by math
class (``fp64``, ``fp64_matrix``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``, ``fp4``, only those
the GPU has and a vendor document gives), its memory bandwidth in GB/s (10^9 bytes/s) and, per number, the
vendor's datasheet, whitepaper or product page (nvidia.com, amd.com) it was read from. Where a datasheet quotes
2:4-sparse tensor peaks the dense figure (half) is stored, and the source says so. A figure only third-party pages
give is kept under ``unverified`` in the JSON and never served: a GPU can be recognised and still lack a figure
(``peak_tflops`` without the class, ``hbm_gbs`` None), and the rules then ask for the flag.

:func:`lookup` recognises a GPU from the device name a trace carries (Kineto ``deviceProperties[].name``, Nsight
``TARGET_INFO_GPU.name``, NVML in a ``tracediag env`` snapshot): ``NVIDIA H100 80GB HBM3``, ``NVIDIA
A100-PG509-200``, ``NVIDIA B300 SXM6 AC``, ``Tesla V100-SXM2-32GB``, ``AMD Instinct MI300X``. A name several
variants share (an A100 SXM board of 40 or 80 GB, an MI250X seen as one die or as the module) is told apart by the
memory size and the SM/CU count. A GPU whose name is empty (ROCm traces can carry ``name: ""``) is inferred from
its vendor, SM/CU count and memory size, and ``matched_by`` says so. An unknown name is not guessed at: ``None``.

A datasheet peak is an upper bound no kernel reaches (boost clocks, no sparsity): efficiency against it is
understated. The per-trace lookup (the GPU of the analysed trace, from the store) is
tracediag.derive.device.trace_gpu (the rules read it through tracediag.analyses.gpu.for_trace).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

_DATA_FILE = "gpus.json"
MATH_CLASSES = ("fp64", "fp64_matrix", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
VENDORS = ("nvidia", "amd")
MATCHED_BY_NAME = "name"
INFERRED = "inferred from vendor, SM/CU count and memory"
# a device reports a little less memory than its nominal size (reserved memory; GB vs GiB): the reported size,
# read as GB or as GiB, must lie within this band of the nominal size
MEMORY_BAND = (0.85, 1.08)
# vendor prefixes and product-line words that carry no model information
_NOISE = re.compile(r"\b(?:nvidia|tesla|geforce|amd|instinct|radeon)\b")


@dataclass(frozen=True)
class GpuSpec:
    name: str  # catalogue name, e.g. "NVIDIA H100 SXM5 80GB"
    vendor: str  # "nvidia" | "amd"
    peak_tflops: dict[str, float]  # dense peaks by math class (only those a vendor document gives)
    hbm_gbs: float | None  # memory bandwidth, GB/s (10^9 bytes/s); None where no vendor figure exists
    sources: dict[str, str]  # per number (key as in peak_tflops, plus "hbm_gbs"): where it comes from
    matched_by: str  # "name" | "inferred from vendor, SM/CU count and memory (...)"


@dataclass(frozen=True)
class Entry:
    """One catalogue row as stored, with how it is recognised."""

    name: str
    vendor: str
    names: tuple[re.Pattern[str], ...]
    memory_gb: tuple[float, ...]
    sm_count: tuple[int, ...]
    peak_tflops: dict[str, float]
    hbm_gbs: float | None
    sources: dict[str, str]
    unverified: dict[str, dict[str, Any]]  # third-party figures kept for the record, never served
    note: str

    def spec(self, matched_by: str) -> GpuSpec:
        return GpuSpec(self.name, self.vendor, dict(self.peak_tflops), self.hbm_gbs, dict(self.sources), matched_by)


def _entry(raw: dict[str, Any]) -> Entry:
    peaks = {k: float(v) for k, v in raw["peak_tflops"].items()}
    unknown = set(peaks) - set(MATH_CLASSES)
    if unknown or raw["vendor"] not in VENDORS:
        raise ValueError(f"{raw['name']}: unknown math class {sorted(unknown)} or vendor {raw['vendor']!r}")
    return Entry(
        name=raw["name"],
        vendor=raw["vendor"],
        names=tuple(re.compile(p) for p in raw["names"]),
        memory_gb=tuple(float(m) for m in raw["memory_gb"]),
        sm_count=tuple(int(s) for s in raw["sm_count"]),
        peak_tflops=peaks,
        hbm_gbs=float(raw["hbm_gbs"]) if raw.get("hbm_gbs") is not None else None,
        sources=dict(raw["sources"]),
        unverified=dict(raw.get("unverified") or {}),
        note=raw.get("note", ""),
    )


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """Every catalogue row, in file order (specific before generic where names overlap)."""
    doc = json.loads(resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8"))
    return tuple(_entry(raw) for raw in doc["gpus"])


def normalise_name(name: str) -> str:
    """'NVIDIA A100-SXM4-40GB' -> 'a100 sxm4 40gb', 'AMD Instinct MI300X' -> 'mi300x': lower case, the vendor and
    product-line words dropped, '-' and '_' as spaces."""
    s = _NOISE.sub(" ", name.lower().replace("-", " ").replace("_", " ").replace("/", " "))
    return " ".join(s.split())


def _memory_fit(memory_bytes: int | None, entry: Entry) -> float | None:
    """How far the reported memory is from the entry's nominal size (|log ratio|, GB or GiB reading, whichever is
    closer), or None when it lies outside the band (or either is unknown)."""
    if not memory_bytes or memory_bytes <= 0 or not entry.memory_gb:
        return None
    best = None
    for nominal in entry.memory_gb:
        for size in (memory_bytes / 1e9, memory_bytes / 2**30):
            ratio = size / nominal
            if MEMORY_BAND[0] <= ratio <= MEMORY_BAND[1]:
                d = abs(math.log(ratio))
                best = d if best is None or d < best else best
    return best


def _narrow(cands: list[Entry], sm_count: int | None, memory_bytes: int | None) -> list[Entry]:
    """The candidates the SM/CU count and the memory size agree with (closest memory first); the input list when
    neither tells them apart."""
    if sm_count:
        by_sm = [e for e in cands if sm_count in e.sm_count]
        cands = by_sm or cands
    fits = [(d, e) for e in cands if (d := _memory_fit(memory_bytes, e)) is not None]
    if fits:
        best = min(d for d, _ in fits)
        cands = [e for d, e in fits if d - best < 1e-9]
    return cands


def _by_name(name: str, sm_count: int | None, memory_bytes: int | None) -> Entry | None:
    key = normalise_name(name)
    cands = [e for e in entries() if any(p.search(key) for p in e.names)]
    if len(cands) > 1:
        cands = _narrow(cands, sm_count, memory_bytes)
    # several variants left (a bare "NVIDIA H100" with neither SM count nor memory): not guessed at
    if len(cands) != 1:
        return None
    e = cands[0]
    # a reported memory size no variant of the name has (a 12 GB board of a 10 GB entry, a MIG slice) is another
    # GPU than the catalogue's: not guessed at either
    if memory_bytes and e.memory_gb and _memory_fit(memory_bytes, e) is None:
        return None
    return e


def _inferred(vendor: str, sm_count: int, memory_bytes: int) -> Entry | None:
    cands = [e for e in entries() if e.vendor == vendor and sm_count in e.sm_count]
    fits = [(d, e) for e in cands if (d := _memory_fit(memory_bytes, e)) is not None]
    if not fits:
        return None
    best = min(d for d, _ in fits)
    winners = [e for d, e in fits if d - best < 1e-9]
    return winners[0] if len(winners) == 1 else None


def lookup(
    name: str | None, *, vendor: str | None = None, sm_count: int | None = None, memory_bytes: int | None = None
) -> GpuSpec | None:
    """The catalogue's GPU for a device: by its name (variants a name shares told apart by the memory size and the
    SM/CU count); when the name is empty, inferred from vendor + SM/CU count + memory size. None for a name the
    catalogue does not know (never guessed from its SM count) or when the facts do not single out one GPU."""
    if name and name.strip():
        e = _by_name(name, sm_count, memory_bytes)
        return e.spec(MATCHED_BY_NAME) if e else None
    v = (vendor or "").strip().lower()
    if v not in VENDORS or not sm_count or not memory_bytes:
        return None
    e = _inferred(v, sm_count, memory_bytes)
    if e is None:
        return None
    units = "CUs" if v == "amd" else "SMs"
    facts = f"vendor {v}, {sm_count} {units}, {memory_bytes / 2**30:.1f} GiB; the device name is empty"
    return e.spec(f"{INFERRED} ({facts})")


def peak(spec: GpuSpec, math_class: str) -> tuple[float | None, str]:
    """(dense TFLOP/s, the class it is for) of `math_class` on the GPU; bf16 and fp16 stand in for each other when
    the catalogue has only one of them (same tensor rate on every GPU that has both). (None, class) when the GPU
    has no figure for it."""
    if math_class in spec.peak_tflops:
        return spec.peak_tflops[math_class], math_class
    twin = {"bf16": "fp16", "fp16": "bf16"}.get(math_class)
    if twin and twin in spec.peak_tflops:
        return spec.peak_tflops[twin], twin
    return None, math_class


UPPER_BOUND = (
    "a datasheet peak is an upper bound that kernels do not reach (boost clock, ideal issue), so the efficiency "
    "against it is understated; pass the flag with a measured figure to replace it"
)


def catalog_label(spec: GpuSpec, key: str) -> str:
    """'from the GPU catalogue: <name>, <source>' (+ how the GPU was recognised when it was inferred)."""
    how = f"; the GPU {spec.matched_by}" if spec.matched_by.startswith(INFERRED) else ""
    return f"from the GPU catalogue: {spec.name}, {spec.sources[key]}{how}"
