"""The GPU of the analysed trace, from what the store holds, and the peaks the rules use when the user gave none.

Where the store says which GPU ran (in this order, the first that names a catalogued GPU wins):

- ``inputs`` rows of the trace ranks (lowest rank first): ``device_name``, ``device_total_mem_bytes``,
  ``device_num_sms`` and ``device_properties_json``, filled from Kineto ``deviceProperties`` (the entry of the
  rank's device) and from Nsight ``TARGET_INFO_GPU``;
- ``topo_gpus``: the NVML names and memory sizes of a ``tracediag env`` topology snapshot (``--topology``).

The vendor, needed when the name is empty (the MI300X TraceLens traces carry ``name: ""``), comes from the name, the
device properties' warp size (64 on AMD CDNA, 32 on NVIDIA) or ROCm runtime calls (``hip*``) in the trace.

``peak_flops`` and ``bandwidth`` are the rules' fallbacks: ``--peak-tflops`` / ``--hbm-bandwidth`` when given
(they always win), else the catalogue's figure for this GPU, labelled "from the GPU catalogue: <name>, <source>".
A datasheet peak is an upper bound no kernel reaches, so an efficiency against it is understated; the label says so.

Public functions (KRN005, KRN007, COL003 and the per-op roofline, tracediag.derive.op_roofline, call them; keep
their signatures):

- ``for_trace(ctx) -> GpuSpec | None``: the catalogued GPU of the trace (``GpuSpec.matched_by`` says whether by
  name or inferred); None when the store names none the catalogue knows.
- ``device_named(ctx) -> str | None``: the device name the trace carries, for saying which GPU is unknown.
- ``activation_class(ctx) -> (math class, why)``: the math class of the model's GEMMs.
- ``peak_flops(ctx) -> (FLOP/s | None, source or why not)`` and ``bandwidth(ctx) -> (bytes/s | None, source or why
  not)``: flag first, then the catalogue.
- ``catalog_label(spec, key) -> str``: "from the GPU catalogue: <GPU>, <source of that number>" (+ how the GPU was
  inferred); ``key`` a math class or ``"hbm_gbs"`` present in ``spec.sources``.
- ``UPPER_BOUND``: the sentence every catalogue figure carries.
"""

from __future__ import annotations

from tracediag.catalog.gpus import UPPER_BOUND, GpuSpec, catalog_label, peak
from tracediag.context import Context
from tracediag.derive import device
from tracediag.model.dtypes import canonical_dtype

DEFAULT_CLASS = "bf16"  # activations of the LLMs served today, when neither the trace nor the config says
# canonical dtype (tracediag.model.dtypes) -> the math class its GEMMs run at
_CLASS_OF = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp64": "fp64_matrix", "fp8_e4m3": "fp8",
             "fp8_e5m2": "fp8", "int8": "int8"}  # fmt: skip


def for_trace(ctx: Context) -> GpuSpec | None:
    """The catalogued GPU of the analysed trace (tracediag.derive.device.trace_gpu), or None when the store names
    none the catalogue knows."""
    return ctx.once("gpu_catalog_spec", lambda: device.trace_gpu(ctx.con))


def device_named(ctx: Context) -> str | None:
    """The device name the trace carries, when there is one (for saying which GPU the catalogue lacks)."""
    return ctx.once("gpu_device_named", lambda: device.device_named(ctx.con))


def activation_class(ctx: Context) -> tuple[str, str]:
    """The math class the model's GEMMs run at: the commonest GEMM activation type in the trace, else the config's
    torch_dtype, else bf16 (assumed, and said)."""
    row = ctx.rows(
        "SELECT act_type, count(*) AS n FROM gemm_shapes WHERE act_type IS NOT NULL "
        "GROUP BY act_type ORDER BY n DESC, act_type LIMIT 1"
    )
    if row and (cls := _CLASS_OF.get(canonical_dtype(row[0]["act_type"]) or "")):
        return cls, f"GEMM activation type in the trace ({row[0]['act_type']})"
    m = ctx.model
    if m is not None and m.dtype and (cls := _CLASS_OF.get(canonical_dtype(m.dtype) or "")):
        return cls, f"config torch_dtype ({m.dtype})"
    return DEFAULT_CLASS, "bf16 assumed (no GEMM input types in the trace, no torch_dtype in the config)"


def peak_flops(ctx: Context) -> tuple[float | None, str]:
    """Dense peak FLOP/s for the model's GEMMs and where it came from: --peak-tflops, else the catalogue's peak of
    the activation type's math class on this GPU (labelled an upper bound); (None, why) when neither exists."""
    if ctx.settings.peak_tflops:
        return ctx.settings.peak_tflops * 1e12, f"--peak-tflops {ctx.settings.peak_tflops:g}"
    spec = for_trace(ctx)
    if spec is None:
        named = device_named(ctx)
        return None, (f"the GPU '{named}' is not in the GPU catalogue" if named else "no GPU named in the trace")
    wanted, why = activation_class(ctx)
    tflops, cls = peak(spec, wanted)
    if tflops is None:
        return None, f"the GPU catalogue has no vendor-sourced {wanted} peak for {spec.name} ({why})"
    used = f"{cls} dense peak {tflops:g} TFLOP/s" + (f" (no {wanted} figure)" if cls != wanted else "")
    return tflops * 1e12, f"{catalog_label(spec, cls)}; {used} for the {why}; {UPPER_BOUND}"


def bandwidth(ctx: Context) -> tuple[float | None, str]:
    """Memory bandwidth in bytes/s from the catalogue for this GPU (labelled a datasheet peak), or (None, why).
    --hbm-bandwidth, when given, wins (KRN005 asks for it and for the trace's own device properties first)."""
    if ctx.settings.hbm_bandwidth_gbs:
        gbs = ctx.settings.hbm_bandwidth_gbs
        return gbs * 1e9, f"--hbm-bandwidth {gbs:g} GB/s"
    spec = for_trace(ctx)
    if spec is None:
        named = device_named(ctx)
        return None, (f"the GPU '{named}' is not in the GPU catalogue" if named else "no GPU named in the trace")
    if spec.hbm_gbs is None:
        return None, f"the GPU catalogue has no vendor-sourced memory bandwidth for {spec.name}"
    return spec.hbm_gbs * 1e9, f"{catalog_label(spec, 'hbm_gbs')}; {spec.hbm_gbs:g} GB/s; {UPPER_BOUND}"
