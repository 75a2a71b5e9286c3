"""What each vendored real GPU trace holds, counted straight from the file (stdlib only: gzip + json for Kineto,
sqlite3 for Nsight Systems exports), independently of tracediag; and the table of docs/real_traces.md with every
rule's verdict on it.

    python tests/real_traces.py > docs/real_traces.md     # regenerate (tests/test_real_traces_doc.py checks it)
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import sqlite3
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTERNAL = REPO / "tests" / "data" / "external"
TRACES = (
    sorted((EXTERNAL / "kineto").glob("*.json.gz"))
    + sorted((EXTERNAL / "kineto" / "capture").glob("*.json.gz"))  # a graph capture, analysed on its own too
    + sorted((EXTERNAL / "nsys").glob("*.sqlite"))
)

# independent name tests (not the catalog): what a reader would grep for
ATTENTION = re.compile(r"attn|attention|fmha|flash|paged|mha", re.I)
# vLLM's KV-cache write (`reshape_and_cache_flash_kernel`, op `_C_cache_ops::reshape_and_cache_flash`): named after the
# cache layout, not attention
KV_CACHE_WRITE = re.compile(r"reshape_and_cache", re.I)


def _attention(name: str) -> bool:
    return bool(ATTENTION.search(name)) and not KV_CACHE_WRITE.search(name)


COLLECTIVE = re.compile(r"^(?:void )?nccl|rccl|cross_device_reduce|all_?reduce|allgather|reducescatter", re.I)
ENGINE_STEP = re.compile(r"^(?:execute_\d|execute_context_|execute_new_|step\[|\[Executor\] _forward_step)")
STEP_LIKE = re.compile(r"^(?:execute_|(?:draft )?step\[|ProfilerStep#|\[Executor\]|_forward_step)")
GEMM_OPS = ("aten::linear", "aten::mm", "aten::addmm", "aten::matmul")
EMBEDDING_BAG = re.compile(r"embedding_bag|torchrec|split_embedding|batched_embedding|fbgemm::", re.I)
CONV = re.compile(r"^aten::(?:cudnn_|miopen_)?conv", re.I)
BACKWARD = re.compile(r"autograd::engine::evaluate_function|Backward\d*$|PostBackward|^Optimizer\.step#")
# a causal decoder in kernel and op names: KV-cache writes (vLLM reshape_and_cache, SGLang store_kvcache and its
# paged token-slot allocation), attention over a paged / varlen / split KV cache, and attention kernels that say they
# are causal (FlashAttention-2's second template bool after the traits, FA3's compute_attn_ws's first; `Causal`)
DECODER_NAME = re.compile(
    r"reshape_and_cache|store_kvcache|token_slots|paged|PagedKv|varlen|splitkv|unified_attention|BatchPrefill"
    r"|Causal|flash_fwd_kernel<.*?_traits<.*?>\s*>,\s*(?:\(bool\))?\w+,\s*(?:true|\(bool\)1)"
    r"|compute_attn_ws<[^<>]*_traits<[^<>]*>,\s*(?:true|\(bool\)1)",
    re.I,
)
# kernels of a backward pass or an optimizer; convolution kernels (cuDNN, CUTLASS, MIOpen, Composable Kernel)
BACKWARD_KERNEL = re.compile(r"backward|flash_bwd|FlashAttnBwd|grad_input|wgrad|igemm_wrw|bn_bw_|adam|adagrad", re.I)
CONV_KERNEL = re.compile(r"conv|fprop|wgrad|winograd|igemm_(?:fwd|bwd|wrw)", re.I)
# an engine-step annotation with decoding requests
DECODING_STEP = re.compile(r"_generation_[1-9]|^step\[DECODE|^(?:draft )?step\[.*DECODE")
# host calls that are not start-up work: a synchronize, a copy (KRN006's kinds when they block)
NOT_STARTUP = re.compile(r"Synchronize|Memcpy|Memset", re.I)
RECORDED = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
)  # fmt: skip  (Kineto categories of recorded events: tracediag's events)


@dataclass
class Inventory:
    trace: str
    format: str
    device: str
    world_size: int | None
    ranks: int
    kernels: int
    distinct_kernels: int
    cpu_ops: int
    annotations: int
    engine_step_annotations: int
    step_like_annotations: int
    runtime_calls: int
    graph_launches: int
    collective_kernels: int
    attention_kernels: int
    backward_or_optimizer_events: int
    gemm_ops_with_shapes: int
    # what the window fitness rests on (tracediag/derive/fitness.py), counted here from the file
    recorded_events: int = 0  # kernels, copies/memsets, runtime calls, CPU ops, annotations
    gpu_copies: int = 0  # memcpy and memset activities
    gpu_time_ns: int = 0  # summed duration of the kernels, copies and memsets (an upper bound of any busy union)
    gpu_backend: bool = False  # distributedInfo names NCCL/RCCL, or the file has device properties or runtime calls
    external_id_gap_median: float | None = None  # CPU ops' consecutive external ids (>= 20 ops)
    correlation_gap_median: float | None = None  # runtime calls' consecutive correlation ids (>= 20 calls)
    kernels_after_last_slow_call: int | None = None  # kernels after the last >= 1 ms host call (not a sync or copy)
    # that starts before the last kernel
    # the trace's span before its first kernel, or before the end of the last slow host call (as counted for
    # kernels_after_last_slow_call) when that is later, as a share of the span: the start-up segment's upper bound
    startup_share: float | None = None
    decoding_step_annotations: int = 0  # engine-step annotations with decoding requests
    # what the workload's domain rests on (tracediag/derive/domain.py), counted here from the file
    attention_ops: int = 0  # attention-named CPU ops (vLLM's unified_attention, SDPA), KV-cache writes left out
    embedding_bag_events: int = 0  # CPU ops / kernels of TorchRec / FBGEMM embedding bags
    conv_ops: int = 0  # aten::convolution-family CPU ops
    decoder_events: int = 0  # kernels and CPU ops whose names show a causal decoder (DECODER_NAME)
    backward_kernels: int = 0  # kernels of a backward pass or an optimizer (BACKWARD_KERNEL)
    conv_kernels: int = 0  # convolution kernels (CONV_KERNEL)
    # kernel launches of >= 1 ms: the first launch of their kernel (by name, in the process), or a repeat
    slow_first_launches: int = 0
    slow_repeat_launches: int = 0
    # stream captures (a BeginCapture call and the next EndCapture call on its thread) and the share of the span from
    # the first kernel's start to the last kernel's end their union covers
    graph_captures: int = 0
    graph_capture_share: float | None = None
    # what the per-op roofline (op_roofline, KRN012) rests on: CPU ops with recorded input dims; kernels whose External
    # id names a CPU op (Nsight: PyTorch's emit_nvtx op ranges); GEMM ops with dims that launched a kernel themselves
    ops_with_shapes: int = 0
    kernels_linked_to_ops: int = 0
    gemm_ops_launching_with_shapes: int = 0
    gemm_kernel_share: float = 0.0  # the kernel time those GEMM ops launched, as a share of all kernel time


def _kineto(path: Path) -> Inventory:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]

    def cat(c: str) -> list[dict]:
        return [e for e in xs if e.get("cat") == c]

    kernels = cat("kernel")
    names = [str(e.get("name", "")) for e in kernels]
    ann = [e for e in xs if e.get("cat") == "user_annotation"]
    host = [str(e.get("name", "")) for e in xs if e.get("cat") in ("cpu_op", "user_annotation")]
    runtime = cat("cuda_runtime") + cat("cuda_driver")
    dist = doc.get("distributedInfo") if isinstance(doc, dict) else None
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    device = ""
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device = str(props[0].get("name") or "")
    ids = sorted({(e.get("args") or {}).get("External id") for e in cat("cpu_op")} - {None, 0})
    corr = sorted({(e.get("args") or {}).get("correlation") for e in runtime} - {None, 0})
    last_kernel = max((e["ts"] for e in kernels), default=None)
    slow_end = max(
        (
            e["ts"] + e["dur"]
            for e in runtime
            if e.get("dur", 0) >= 1000  # Kineto times are µs
            and not NOT_STARTUP.search(str(e.get("name")))
            and (last_kernel is None or e["ts"] < last_kernel)  # teardown after the last kernel is not start-up
        ),
        default=None,
    )
    by_corr = {(e.get("args") or {}).get("correlation"): str(e.get("name", "")) for e in kernels}
    slow_first, slow_repeat = _slow_launches(
        [
            (e.get("pid"), by_corr[c], e["ts"], e.get("dur", 0) * 1000)
            for e in runtime
            if (c := (e.get("args") or {}).get("correlation")) and c in by_corr
        ]
    )
    captures, capture_share = _captures(
        [(e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0), str(e.get("name", ""))) for e in runtime],
        [(e["ts"], e["ts"] + e.get("dur", 0)) for e in kernels],
    )
    op_ids = {(e.get("args") or {}).get("External id") for e in cat("cpu_op")} - {None, 0}
    kernel_ids = {(e.get("args") or {}).get("External id") for e in kernels} - {None, 0}
    shaped = [e for e in cat("cpu_op") if (e.get("args") or {}).get("Input Dims") not in (None, [])]
    gemm_ids = {(e.get("args") or {}).get("External id") for e in shaped if e.get("name") in GEMM_OPS} & kernel_ids
    gemm_us = sum(e.get("dur", 0) for e in kernels if (e.get("args") or {}).get("External id") in gemm_ids)
    return Inventory(
        ops_with_shapes=len(shaped),
        kernels_linked_to_ops=sum(1 for e in kernels if (e.get("args") or {}).get("External id") in op_ids),
        gemm_ops_launching_with_shapes=sum(
            1 for e in shaped if e.get("name") in GEMM_OPS and (e.get("args") or {}).get("External id") in kernel_ids
        ),
        gemm_kernel_share=gemm_us / (sum(e.get("dur", 0) for e in kernels) or 1),
        graph_captures=captures,
        graph_capture_share=capture_share,
        slow_first_launches=slow_first,
        slow_repeat_launches=slow_repeat,
        recorded_events=sum(1 for e in xs if e.get("cat") in RECORDED),
        gpu_copies=len(cat("gpu_memcpy")) + len(cat("gpu_memset")),
        gpu_time_ns=round(sum(float(e.get("dur") or 0) for e in kernels + cat("gpu_memcpy") + cat("gpu_memset")) * 1e3),
        gpu_backend=bool(
            (isinstance(dist, dict) and re.search(r"nccl|rccl", str(dist.get("backend") or ""), re.I))
            or props
            or runtime
        ),
        external_id_gap_median=_gap_median(ids),
        correlation_gap_median=_gap_median(corr),
        kernels_after_last_slow_call=sum(1 for e in kernels if slow_end is None or e["ts"] >= slow_end),
        startup_share=_startup_share(
            [e["ts"] for e in kernels],
            slow_end,
            [(e["ts"], e["ts"] + e.get("dur", 0)) for e in xs if e.get("cat") in RECORDED],
        ),
        decoding_step_annotations=sum(1 for e in ann if DECODING_STEP.search(str(e.get("name", "")))),
        embedding_bag_events=sum(1 for e in cat("cpu_op") + kernels if EMBEDDING_BAG.search(str(e.get("name", "")))),
        conv_ops=sum(1 for e in cat("cpu_op") if CONV.search(str(e.get("name", "")))),
        decoder_events=sum(1 for n in names + host if DECODER_NAME.search(n)),
        backward_kernels=sum(1 for n in names if BACKWARD_KERNEL.search(n)),
        conv_kernels=sum(1 for n in names if CONV_KERNEL.search(n) and not re.search(r"convert", n, re.I)),
        trace=path.name,
        format="kineto",
        device=device,
        world_size=dist.get("world_size") if isinstance(dist, dict) else None,
        ranks=1,
        kernels=len(kernels),
        distinct_kernels=len(set(names)),
        cpu_ops=len(cat("cpu_op")),
        annotations=len(ann),
        engine_step_annotations=sum(1 for e in ann if ENGINE_STEP.match(str(e.get("name", "")))),
        step_like_annotations=sum(1 for e in ann if STEP_LIKE.match(str(e.get("name", "")))),
        runtime_calls=len(runtime),
        graph_launches=sum(1 for e in runtime if "GraphLaunch" in str(e.get("name", ""))),
        collective_kernels=sum(1 for n in names if COLLECTIVE.search(n)),
        attention_kernels=sum(1 for n in names if _attention(n)),
        attention_ops=sum(1 for e in cat("cpu_op") if _attention(str(e.get("name", "")))),
        backward_or_optimizer_events=sum(1 for n in host if BACKWARD.search(n)),
        gemm_ops_with_shapes=sum(
            1
            for e in cat("cpu_op")
            if e.get("name") in GEMM_OPS and (e.get("args") or {}).get("Input Dims") not in (None, [])
        ),
    )


def _nsys(path: Path) -> Inventory:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def q(sql: str, default=0):
        try:
            return con.execute(sql).fetchone()[0]
        except sqlite3.Error:
            return default

    strings = "StringIds"
    kname = (
        f"(SELECT value FROM {strings} WHERE id = coalesce(k.demangledName, k.shortName))"
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables
        else "NULL"
    )
    names = (
        [r[0] or "" for r in con.execute(f"SELECT {kname} FROM CUPTI_ACTIVITY_KIND_KERNEL k")]
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables
        else []
    )
    rt_names = (
        [
            r[0] or ""
            for r in con.execute(
                f"SELECT (SELECT value FROM {strings} WHERE id = r.nameId) FROM CUPTI_ACTIVITY_KIND_RUNTIME r"
            )
        ]
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables
        else []
    )
    nvtx = (
        [r[0] or "" for r in con.execute("SELECT coalesce(text, (SELECT value FROM StringIds WHERE id = textId)) "
                                          "FROM NVTX_EVENTS")]
        if "NVTX_EVENTS" in tables
        else []
    )  # fmt: skip
    device = ""
    if "TARGET_INFO_GPU" in tables:
        device = str(q("SELECT name FROM TARGET_INFO_GPU LIMIT 1", "") or "")
    gpu_pids = q("SELECT count(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL", 0) if names else 0
    copy_tables = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
    copies = sum(q(f"SELECT count(*) FROM {t}") for t in copy_tables if t in tables)
    corr, slow_end, after = [], None, None
    captures, capture_share = 0, None
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        rows = con.execute(
            "SELECT r.correlationId, r.start, r.end, (SELECT value FROM StringIds WHERE id = r.nameId), r.globalTid "
            "FROM CUPTI_ACTIVITY_KIND_RUNTIME r"
        ).fetchall()
        captures, capture_share = _captures(
            [(r[4], r[1], r[2], r[3] or "") for r in rows],
            con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall() if names else [],
        )
        # one id per GPU process (a two-GPU export numbers each process's calls apart): the median over processes
        corr = sorted({r[0] for r in rows} - {None, 0})
        last_kernel = q("SELECT max(start) FROM CUPTI_ACTIVITY_KIND_KERNEL", None) if names else None
        slow = [
            r[2]
            for r in rows
            if r[2] - r[1] >= 1_000_000
            and not NOT_STARTUP.search(r[3] or "")
            and (last_kernel is None or r[1] < last_kernel)
        ]
        slow_end = max(slow, default=None)
    slow_first = slow_repeat = 0
    if names and "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        after = q(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= {int(slow_end or 0)}")
        slow_first, slow_repeat = _slow_launches(
            con.execute(
                f"SELECT k.globalPid, {kname}, r.start, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
                "AND k.globalPid = (r.globalTid >> 24) << 24"
            ).fetchall()
        )
    elif names:
        after = q(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= {int(slow_end or 0)}")
    first_share = _startup_share(
        [r[0] for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL")] if names else [],
        slow_end,
        [
            (a, b)
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", *copy_tables, "NVTX_EVENTS")
            if t in tables
            for a, b in con.execute(f'SELECT min(start), max(coalesce("end", start)) FROM {t}').fetchall()
            if a is not None
        ],
    )
    con.close()
    return Inventory(
        graph_captures=captures,
        graph_capture_share=capture_share,
        slow_first_launches=slow_first,
        slow_repeat_launches=slow_repeat,
        recorded_events=len(names) + copies + len(rt_names) + len(nvtx),
        gpu_copies=copies,
        ops_with_shapes=sum(1 for n in nvtx if "sizes = [[" in n),
        kernels_linked_to_ops=sum(1 for n in nvtx if n.startswith("aten::")),
        gemm_ops_launching_with_shapes=sum(1 for n in nvtx if n.split(",")[0] in GEMM_OPS and "sizes = [[" in n),
        gpu_time_ns=sum(
            q(f'SELECT coalesce(sum("end" - start), 0) FROM {t}')
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", *copy_tables)
            if t in tables
        ),
        gpu_backend=bool(names or rt_names),
        external_id_gap_median=None,
        correlation_gap_median=_gap_median(corr) if gpu_pids <= 1 else None,
        kernels_after_last_slow_call=after,
        startup_share=first_share,
        decoding_step_annotations=sum(1 for n in nvtx if DECODING_STEP.search(n)),
        embedding_bag_events=sum(1 for n in nvtx + names if EMBEDDING_BAG.search(n)),
        conv_ops=sum(1 for n in nvtx if CONV.search(n.split(",")[0])),
        decoder_events=sum(1 for n in names if DECODER_NAME.search(n)),
        backward_kernels=sum(1 for n in names if BACKWARD_KERNEL.search(n)),
        conv_kernels=sum(1 for n in names if CONV_KERNEL.search(n) and not re.search(r"convert", n, re.I)),
        trace=path.name,
        format="nsys-sqlite",
        device=device,
        world_size=None,
        ranks=int(gpu_pids or 0),
        kernels=len(names),
        distinct_kernels=len(set(names)),
        cpu_ops=0,
        annotations=len(nvtx),
        engine_step_annotations=sum(1 for n in nvtx if ENGINE_STEP.match(n)),
        step_like_annotations=sum(1 for n in nvtx if STEP_LIKE.match(n)),
        runtime_calls=len(rt_names),
        graph_launches=sum(1 for n in rt_names if "GraphLaunch" in n),
        collective_kernels=sum(1 for n in names if COLLECTIVE.search(n)),
        attention_kernels=sum(1 for n in names if _attention(n)),
        backward_or_optimizer_events=sum(1 for n in nvtx if BACKWARD.search(n)),
        # PyTorch emit_nvtx ranges: "aten::mm, seq = 12, sizes = [[8, 16], [16, 4]]"
        gemm_ops_with_shapes=sum(1 for n in nvtx if n.split(",")[0] in GEMM_OPS and "sizes = [[" in n),
    )


def _slow_launches(launches: list[tuple]) -> tuple[int, int]:
    """(first, repeat) launches of >= 1 ms among (process, kernel name, start, duration ns) launches."""
    seen, first, repeat = set(), 0, 0
    for pid, name, _, dur in sorted(launches, key=lambda x: x[2]):
        if dur >= 1_000_000:
            first, repeat = (first, repeat + 1) if (pid, name) in seen else (first + 1, repeat)
        seen.add((pid, name))
    return first, repeat


def _startup_share(
    kernel_starts: list[float], slow_end: float | None, spans: list[tuple[float, float]]
) -> float | None:
    """(max(first kernel start, slow_end) - trace start) / trace span, the span from the first recorded event's start
    to the last's end; None without kernels."""
    if not kernel_starts or not spans:
        return None
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    end = max(min(kernel_starts), slow_end if slow_end is not None else t0)
    return (end - t0) / (t1 - t0) if t1 > t0 else None


def _captures(calls: list[tuple], kernel_spans: list[tuple[float, float]]) -> tuple[int, float | None]:
    """(captures, share of the kernels' span their union covers) from (thread, start, end, name) runtime calls."""
    spans, open_ = [], {}
    for tid, a, b, name in sorted(calls, key=lambda c: c[1]):
        if "StreamBeginCapture" in name:
            open_[tid] = a
        elif "StreamEndCapture" in name and tid in open_:
            spans.append((open_.pop(tid), b))
    if not spans or not kernel_spans:
        return len(spans), None
    k0, k1 = min(a for a, _ in kernel_spans), max(b for _, b in kernel_spans)
    covered, reach = 0.0, k0
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, k1)
        if b > a:
            covered, reach = covered + (b - a), b
    return len(spans), covered / (k1 - k0) if k1 > k0 else None


def _gap_median(ids: list[int]) -> float | None:
    """Median step between consecutive sorted ids (None below 20 ids)."""
    if len(ids) < 21:
        return None
    return float(statistics.median(b - a for a, b in itertools.pairwise(ids)))


def inventory(path: Path) -> Inventory:
    return _kineto(path) if path.name.endswith(".json.gz") else _nsys(path)


def verdicts(path: Path) -> list[dict]:
    from tracediag.analysis import analyze

    return [c.to_dict() for c in analyze([path]).checks]


def fitness(path: Path) -> dict | None:
    from tracediag.analysis import analyze

    return analyze([path]).fitness


def expected_window(i: Inventory) -> str:
    """The window class these counts call for (tracediag/derive/fitness.py's order), without tracediag."""
    if i.recorded_events < 10:
        return "too_short"
    if not i.kernels and not i.gpu_copies:
        return "gpu_stripped" if i.gpu_backend else "cpu_only"
    if (i.external_id_gap_median or 0) >= 2 or (i.correlation_gap_median or 0) >= 25:
        return "sampled"
    if i.kernels_after_last_slow_call == 0:
        return "startup_only"
    if (i.startup_share or 0) >= 0.75:  # fitness.STARTUP_DOMINATES of an upper bound of the start-up segment
        return "steady, clipped or startup_dominated"
    if (i.graph_capture_share or 0) >= 0.5:  # fitness.CAPTURE_DOMINATES, of the kernels' span here
        return "graph_capture"
    return "steady or clipped"


def expected_domain(i: Inventory) -> str:
    """The workload label these counts call for (tracediag/derive/domain.py's order), without tracediag: embedding
    bags → recommender, a causal decoder's names or engine or decoding steps → LLM, attention beside convolutions →
    vision transformer, attention alone → transformer encoder, convolutions → vision; training when a backward pass
    or optimizer step was recorded (ops, annotations or kernels), inference with engine steps or an LLM."""
    attention = i.attention_kernels or i.attention_ops
    conv = i.conv_ops or i.conv_kernels
    if i.embedding_bag_events:
        work = "recommender"
    elif i.decoder_events or i.engine_step_annotations or i.decoding_step_annotations:
        work = "LLM"
    elif attention and conv:
        work = "vision transformer"
    elif attention:
        work = "transformer encoder"
    elif conv:
        work = "vision"
    else:
        work = "non-LLM"
    if i.backward_or_optimizer_events or i.backward_kernels:
        return f"{work} training"
    if i.engine_step_annotations or work == "LLM":
        return f"{work} inference"
    return f"{work} (training or inference unknown)"


def kernel_names(path: Path) -> set[str]:
    """Distinct kernel names as the file writes them (Kineto `cat: kernel` events; nsys demangled names)."""
    if path.name.endswith(".json.gz"):
        with gzip.open(path, "rt") as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        return {str(e.get("name", "")) for e in events if isinstance(e, dict) and e.get("cat") == "kernel"}
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            r[0] or ""
            for r in con.execute(
                "SELECT (SELECT value FROM StringIds WHERE id = coalesce(k.demangledName, k.shortName)) "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL k"
            )
        }
    except sqlite3.Error:
        return set()
    finally:
        con.close()


MARK = {"pass": "pass", "finding": "**{sev}**", "not_applicable": "n/a"}


def render(checks_of=None, fitness_of=None) -> str:
    """The page; `checks_of(path)` gives a trace's checks as dicts, `fitness_of(path)` its window fitness (default:
    analyze it)."""
    checks_of = checks_of or verdicts
    fitness_of = fitness_of or fitness
    invs = [inventory(p) for p in TRACES]
    from tracediag.rules import RULE_MODULES

    rules = [m.rsplit(".", 1)[1].split("_")[0].upper() for m in RULE_MODULES]  # walk order
    checks = {p.name: sorted(checks_of(p), key=lambda c: rules.index(c["rule"])) for p in TRACES}
    out = [
        "# Real GPU traces: what they hold and what each rule says",
        "",
        "Generated by `python tests/real_traces.py > docs/real_traces.md`; `tests/test_real_traces_doc.py` fails when",
        "this page is out of date. The counts are read straight from each file by that script (gzip + json, sqlite3)",
        "— not by tracediag — and the test checks tracediag's own counts and every *not applicable* reason against",
        "them.",
        "The files, their sources and licences: `tests/data/external/README.md` (an nsys 2023.2 export of a repository",
        "that publishes no licence is not vendored and not listed). Every rule ran without `--model` and without",
        "serving telemetry, so rules that need those say so.",
        "",
        "## What is in each trace",
        "",
        "| trace | device | world | GPU processes | kernels (distinct) | CPU ops | annotations (engine step / "
        "step-like) | runtime calls (graph launches) | collective kernels | attention-named kernels | "
        "backward/optimizer events |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i in invs:
        out.append(
            f"| `{i.trace}` | {i.device or '—'} | {i.world_size if i.world_size is not None else '—'} | {i.ranks} | "
            f"{i.kernels:,} ({i.distinct_kernels:,}) | {i.cpu_ops:,} | {i.annotations:,} "
            f"({i.engine_step_annotations} / {i.step_like_annotations}) | {i.runtime_calls:,} ({i.graph_launches}) | "
            f"{i.collective_kernels} | {i.attention_kernels} | {i.backward_or_optimizer_events} |"
        )
    out += [
        "",
        "## What the window holds (fitness)",
        "",
        "Counted by this script: recorded events (kernels, copies, runtime calls, CPU ops, annotations), GPU copies",
        "and memsets, whether it is a GPU job (NCCL/RCCL backend, device properties or runtime calls), the median step",
        "between consecutive external ids of the CPU ops and correlation ids of the runtime calls (1 when nothing is",
        "left out; only with at least 20 ids, one GPU process), kernels after the last host call of ≥ 1 ms that is not",
        "a synchronisation or copy and starts before the last kernel (0: start-up only), and the span before the first",
        "kernel or the end of that call, whichever is later, as a share of the trace (an upper bound of the start-up",
        "segment: from 75 % the window may be mostly start-up), and the stream captures (a `…StreamBeginCapture` call",
        "and the next `…StreamEndCapture` on its thread) with the share of the kernels' span they cover (from 50 %",
        "the window is a graph capture). `tracediag` is the class tracediag/derive/fitness.py gives the window; the",
        "test checks it against the class these counts call for.",
        "",
        "| trace | recorded events | GPU copies | GPU job | external-id gap | correlation-id gap | kernels after the "
        "last start-up call | start-up share at most | stream captures (share) | counts call for | tracediag |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    dom_rows = []
    for i, p in zip(invs, TRACES):
        f = fitness_of(p) or {}

        def g(x):
            return "—" if x is None else f"{x:g}"

        out.append(
            f"| `{i.trace}` | {i.recorded_events:,} | {i.gpu_copies:,} | {'yes' if i.gpu_backend else 'no'} | "
            f"{g(i.external_id_gap_median)} | {g(i.correlation_gap_median)} | {g(i.kernels_after_last_slow_call)} | "
            f"{'—' if i.startup_share is None else f'{i.startup_share:.1%}'} | {i.graph_captures}"
            f"{'' if i.graph_capture_share is None else f' ({i.graph_capture_share:.0%})'} | {expected_window(i)} | "
            f"{f.get('class', '—')} |"
        )
        dom = f.get("domain") or {}
        dom_rows.append(
            f"| `{i.trace}` | {i.backward_or_optimizer_events} | {i.engine_step_annotations} | {i.attention_kernels} "
            f"| {i.attention_ops} | {i.decoder_events} | {i.embedding_bag_events} | {i.conv_ops} / {i.conv_kernels} "
            f"| {i.backward_kernels} | {expected_domain(i)} "
            f"| {dom.get('label', '—')} |"
        )
    out += [
        "",
        "## What the workload is (domain)",
        "",
        "Counted by this script: backward/optimizer events, engine-step annotations and attention-named kernels (as",
        "above), attention-named CPU ops (Kineto), embedding-bag CPU ops and kernels (TorchRec / FBGEMM), convolution",
        "CPU ops and kernels, kernels of a backward pass or optimizer; vLLM's KV-cache writes (`reshape_and_cache…`)",
        "are not attention, they are with paged / varlen / split-KV and causal attention kernels a causal decoder's",
        "names (LLM only on those, engine steps or decoding steps). `tracediag` is the label",
        "tracediag/derive/domain.py gives the workload (it counts catalogued attention kernels and attention ops);",
        "the test checks it against the label these counts call for.",
        "",
        "| trace | backward/optimizer events | engine steps | attention-named kernels | attention-named ops | "
        "causal-decoder names | embedding-bag events | convolution ops / kernels | backward kernels | "
        "counts call for | tracediag |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *dom_rows,
    ]
    out += ["", "## Verdicts", "", "pass · **W** warning / **I** info / **E** error finding · n/a not applicable", ""]
    out.append("| trace | " + " | ".join(rules) + " |")
    out.append("|---|" + "---|" * len(rules))
    for name, cs in checks.items():
        cells = []
        for c in cs:
            if c["status"] == "finding":
                cells.append(f"**{c['severity'][0].upper()}**")
            else:
                cells.append(MARK[c["status"]])
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += ["", "## Findings and reasons, per trace", ""]
    for name, cs in checks.items():
        out.append(f"### `{name}`")
        out.append("")
        for c in cs:
            if c["status"] == "finding":
                out.append(f"- **{c['rule']}** ({c['severity']}): {c['title']}")
        na: dict[str, list[str]] = {}
        for c in cs:
            if c["status"] == "not_applicable":
                na.setdefault(c["reason"], []).append(c["rule"])
        for reason, rs in na.items():
            out.append(f"- not applicable ({', '.join(rs)}): {reason}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def as_dicts() -> list[dict]:
    return [asdict(inventory(p)) for p in TRACES]


if __name__ == "__main__":
    sys.stdout.write(render())
