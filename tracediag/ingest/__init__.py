"""Input discovery, format detection and ingest orchestration: files -> canonical tables in the store.

Each format has one parser module with one function `parse(path, order, options) -> Parsed`, named in
FORMATS and imported only when a file of that format is given. Formats are detected from content
(magic bytes, the first lines), not from file names; an explicit format (CLI flag) skips detection.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import importlib.abc
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING

from tracediag.catalog import failures
from tracediag.errors import InputError, UsageError
from tracediag.ingest.base import IngestOptions, Parsed, SpilledTable
from tracediag.ingest.capture_folder import capture_inputs
from tracediag.inputfile import open_stream, regular_file, skip_nul_run
from tracediag.interrupt import checkpoint

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    import duckdb

# format -> (module, function). Profiler traces first: they hold ranks.
FORMATS: dict[str, tuple[str, str]] = {
    "kineto": ("tracediag.ingest.kineto", "parse_kineto"),
    "nsys-sqlite": ("tracediag.ingest.nsys", "parse_nsys_sqlite"),
    "nsys-rep": ("tracediag.ingest.nsys", "parse_nsys_rep"),
    "prometheus": ("tracediag.ingest.prometheus", "parse_prometheus"),
    "vllm-log": ("tracediag.ingest.vllm_log", "parse_vllm_log"),
    "vllm-bench": ("tracediag.ingest.vllm_bench", "parse_vllm_bench"),
    "sglang-log": ("tracediag.ingest.sglang_log", "parse_sglang_log"),
    "sglang-bench": ("tracediag.ingest.sglang_bench", "parse_sglang_bench"),
    "aiperf": ("tracediag.ingest.aiperf", "parse_aiperf"),
    "nccl-tests": ("tracediag.ingest.nccl_tests", "parse_nccl_tests"),
    "topology": ("tracediag.ingest.topology", "parse_topology"),
}
TRACE_FORMATS = frozenset({"kineto", "nsys-sqlite", "nsys-rep"})
_SNIFF_BYTES = 1 << 16


def _head(path: Path, n: int = _SNIFF_BYTES) -> bytes | None:
    """First n bytes of the (decompressed) file after any run of NUL bytes it starts with (a log truncated in
    place: inputfile.skip_nul_run); None when it cannot be read as such (not a regular file, corrupt gzip)."""
    try:
        f, gz = open_stream(path)
        with f:
            skip_nul_run(f, gz)
            return f.read(n)
    except (OSError, EOFError, zlib.error, InputError):
        return None


# a vLLM log record (vllm/logger.py layouts, or an application's `- vllm.module - LEVEL -`), or a vLLM-only message
_VLLM_RECORD = (
    rb"(?m)(?:^|[\s)])(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? "
    rb"\[?[\w./-]+\.py:\d+\]"
    rb"| - vllm\.[\w.]+ - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - |vllm\.(?:engine|v1)\.\w+|MQLLMEngine|RayWorkerVllm"
    rb"|VllmWorkerProcess"
)


def detect_format(path: Path) -> str | None:
    """The input format from content; None when no ingester recognises it."""
    if path.suffix == ".nsys-rep":
        return "nsys-rep"
    head = _head(path)
    if head is None:
        # unreadable or corrupt: let the trace parser report the exact problem
        return "kineto" if path.name.endswith((".json", ".json.gz", ".gz")) else None
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    head = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", head)  # ANSI colour of terminal logs
    text = head.lstrip()
    if re.search(rb"=+ Serving Benchmark Result =+", head):  # a benchmark client's stdout (it logs like vLLM too)
        return "sglang-bench" if re.search(rb"Total generated tokens \(retokenized\)", head) else "vllm-bench"
    if re.search(_VLLM_RECORD, head) and not text.startswith(b"{"):
        return "vllm-log"
    if re.match(rb"\[(?:\d{4}-\d{2}-\d{2} \d|\d{2}:\d{2}:\d{2}[ \]]|[TDP]P\d+\])", text):
        return "sglang-log"  # `[2025-09-03 18:33:18 TP0] Prefill batch. ...`: a log, not JSON
    if re.search(rb"(?:Prefill|Decode) batch[.,] #|\] max_total_num_tokens=\d", head):
        return "sglang-log"
    if text.startswith(b"[") and not re.match(rb"\[\s*(?:[{\]\[\"]|$)", text):  # `[rank2]:[E909 …]`: not JSON
        return _failure_log(head)
    if text.startswith((b"{", b"[")):
        if b'"traceEvents"' in head or b'"ph"' in head or text.startswith(b"["):
            return "kineto"
        if b'"aiperf_version"' in head or (b'"records"' in head and b'"header"' in head and b'"tag"' in head):
            return "aiperf"  # AIPerf profile_export_aiperf.json (its request_throughput key is vLLM's too)
        if re.search(rb'"(?:total_output_tokens_retokenized|mean_e2e_latency_ms)"', head):
            return "sglang-bench"  # python -m sglang.bench_serving --output-file (JSONL)
        if re.search(rb'"(?:request_throughput|completed|ttfts|mean_ttft_ms|output_throughput)"', head):
            return "vllm-bench"
        if b'"nvml' in head or b'"tracediag/topology' in head:
            return "topology"
        if len(head) < _SNIFF_BYTES:  # a whole small JSON file that is none of the above
            return None
        return "kineto"
    if re.search(rb"(?m)^# (?:HELP|TYPE) \w|^(?:vllm|sglang):\w+[{ ]", head):
        return "prometheus"
    if re.search(rb"(?m)^#\s+(?:size\s+count\s+type|Collective test starting|nThread)", head):
        return "nccl-tests"
    if re.search(rb"=+ Serving Benchmark Result =+", head):  # benchmark client stdout table
        return "sglang-bench" if re.search(rb"Total generated tokens \(retokenized\)", head) else "vllm-bench"
    if re.search(rb"(?:Prefill|Decode) batch[.,] #|max_total_num_tokens=\d|sglang", head):
        return "sglang-log"
    if re.search(rb"(?:INFO|WARNING|DEBUG)\s.*(?:vllm|Engine \d{3}|Avg prompt throughput|llm_engine)", head):
        return "vllm-log"
    if path.name.endswith((".json", ".json.gz")):
        return "kineto"
    return _failure_log(head)


_VLLM_PROCESS = re.compile(rb"(?m)^\s*\((?:APIServer|EngineCore\w*|Worker\w*|VllmWorker\w*|RayWorkerVllm) pid=\d+\)")


def _failure_log(head: bytes) -> str | None:
    """A serving log that holds only failure lines (a crash excerpt: PyTorch, runtime and engine messages): the
    engine its process prefixes or its own messages name; a log of engine-neutral failure lines alone is read as an
    SGLang log (both log readers store them alike); None when no line is a catalogued failure."""
    lines = head.decode("utf-8", "replace").splitlines()
    found = [p for p in (failures.match(x, "vllm") or failures.match(x, "sglang") for x in lines) if p is not None]
    if not found and not _VLLM_PROCESS.search(head):
        return None
    if _VLLM_PROCESS.search(head) or any(p.engines == frozenset({"vllm"}) for p in found):
        return "vllm-log"
    return "sglang-log"


def discover_inputs(paths: list[str | Path]) -> list[Path]:
    """Expand directories to the trace files inside them (sorted), keep files as given.

    In a directory, only files some ingester recognises are taken (so a config.json beside the traces
    is passed over); a file named explicitly is always parsed, so a wrong file fails with its own error.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and (p / "capture.json").is_file():  # a `tracediag capture` incident folder
            files = [f for f, _ in capture_inputs(p)]
            if not files:
                raise InputError(p, "capture folder holds no trace, metrics or log")
            found.extend(files)
        elif p.is_dir():
            files = sorted(
                f
                for f in p.iterdir()
                if f.is_file() and not f.name.startswith(".") and detect_format(f) in TRACE_FORMATS
            )
            if not files:
                raise InputError(p, "directory holds no profiler traces (Kineto .json/.json.gz, nsys .sqlite)")
            found.extend(files)
        elif p.exists():
            regular_file(p, "trace")  # a named pipe or a device never ends: refused before it is opened
            found.append(p)
        else:
            raise InputError(p, "no such file or directory")
    if not found:
        raise UsageError("no input files given")
    return found


def parser_for(fmt: str) -> Callable[[Path, int, IngestOptions], Parsed]:
    if fmt not in FORMATS:
        raise UsageError(f"unknown input format '{fmt}' (known: {', '.join(FORMATS)})")
    module, func = FORMATS[fmt]
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        raise UsageError(f"input format '{fmt}' is not supported by this version of tracediag") from None


# An explicit kind (--log, --bench) covers the engines' variants: the content says which one.
_SAME_KIND = {"vllm-log": ("sglang-log",), "vllm-bench": ("sglang-bench", "aiperf")}


def _parse_job(args: tuple) -> Parsed:
    """One parse of (path, format, order, options[, spill]); in a parser process (`spill` set) its tables are
    written as Arrow IPC files into `spill` and `Parsed.tables` holds their paths: the parent maps them instead
    of unpickling copies."""
    path, fmt, order, options, *rest = args
    spill = rest[0] if rest else None
    parsed = parse_one(Path(path), fmt, order, options)
    if spill is not None:
        parsed.tables = _write_ipc(parsed.tables, Path(spill) / f"{order}")
    return parsed


def _write_ipc(tables: dict, base: Path) -> dict[str, str]:
    import pyarrow as pa

    out = {}
    for name, t in tables.items():
        if isinstance(t, SpilledTable):  # already on disk, in the folder the parent reads
            out[name] = t
            continue
        path = f"{base}.{name}.arrow"
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as writer:
            writer.write_table(t)
        out[name] = path
    return out


def _read_ipc(tables: dict) -> dict:
    """Map the IPC files a parser process wrote (zero copy) and unlink them: the mapping outlives the name."""
    import pyarrow as pa

    out = {}
    for name, path in tables.items():
        if isinstance(path, SpilledTable):
            out[name] = path
            continue
        out[name] = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
        with contextlib.suppress(OSError):
            os.unlink(path)
    return out


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not imported while parsing", name=name)
        return None


@contextlib.contextmanager
def without_pandas() -> Iterator[None]:
    """No pandas import while parsing or analysing: `pyarrow.array(list)` and `Table.from_pylist` ask whether
    pandas is installed (importing it: ~0.4 s, 400 modules) to see if the list is a Series; nothing of ours
    needs it. When pandas is already imported (a notebook) nothing changes; after the block it imports as usual."""
    if "pandas" in sys.modules:
        yield
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def parse_one(p: Path, fmt: str | None, order: int, options: IngestOptions) -> Parsed:
    """Parse one input file (format detected from content when `fmt` is None, refined within one kind)."""
    with without_pandas():
        return _parse_one(p, fmt, order, options)


def _parse_one(p: Path, fmt: str | None, order: int, options: IngestOptions) -> Parsed:
    regular_file(p)  # before the format is sniffed: opening a named pipe would block
    if fmt in _SAME_KIND:
        detected = detect_format(p)
        fmt = detected if detected in _SAME_KIND[fmt] else fmt
    fmt = fmt or detect_format(p)
    if fmt is None:
        raise InputError(
            p,
            "unrecognised input: not a Kineto trace, nsys export, vLLM or SGLang log/metrics/benchmark "
            "result or nccl-tests output",
        )
    return parser_for(fmt)(p, order, options)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _worker_init(parent: int) -> None:
    """In each parser process: die with the parent, and leave Ctrl-C and SIGTERM handling to it.

    On Linux the kernel kills the worker when the parent dies (PR_SET_PDEATHSIG, so `kill -9` of the parent too);
    elsewhere, and as a second line, a thread exits the worker once its parent is gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # forked with them blocked (parse_all): now they are handled as above
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="tracediag-parent-watch", daemon=True).start()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _submit_all(pool: ProcessPoolExecutor, work: list) -> list[Future]:
    """Submit every job with Ctrl-C and SIGTERM held back: a worker forked now starts with them blocked, so one
    that arrives before its initializer ignores it cannot kill it half-started (a traceback, a pool left waiting);
    the parent receives the held signal as soon as the jobs are submitted."""
    if not hasattr(signal, "pthread_sigmask"):
        return [pool.submit(_parse_job, w) for w in work]
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return [pool.submit(_parse_job, w) for w in work]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """End the parser processes now (an interrupted run must not wait for a 1 GB parse to finish)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, AttributeError):
            proc.kill()


def _result(future: Future, path: str) -> Parsed:
    from concurrent.futures.process import BrokenProcessPool

    try:
        parsed = future.result()
    except BrokenProcessPool:
        raise InputError(
            path,
            "the parser process reading this file was killed (out of memory?); pass fewer files at once or --jobs 1",
        ) from None
    parsed.tables = _read_ipc(parsed.tables)
    return parsed


# Below this many bytes of (decompressed) input in all, the files are parsed in this process: starting parser
# processes and passing their tables back costs more than parsing a few MB.
_SERIAL_BYTES = 48 << 20
_GZIP_RATIO = 12  # a Kineto JSON compresses 8-15x


def _input_bytes(files: list[tuple[Path, str | None]]) -> int:
    total = 0
    for p, _ in files:
        try:
            with open(p, "rb") as f:
                gz = f.read(2) == b"\x1f\x8b"
                total += os.fstat(f.fileno()).st_size * (_GZIP_RATIO if gz else 1)
        except OSError:
            pass
    return total


_POLL_S = 0.2  # how often the parent looks at the stop flag while parser processes run


def parse_all(
    files: list[Path] | list[tuple[Path, str | None]],
    keep_python: bool = False,
    jobs: int | None = None,
    options: IngestOptions | None = None,
    spill_dir: str | Path | None = None,
    parts_dir: str | Path | None = None,
) -> list[Parsed]:
    """Parse inputs, one process per file when there are several (bounded by the cores; by default in this
    process when all the inputs together are small).

    Parser processes hand their tables back as Arrow IPC files in a temporary folder (under `spill_dir`, default
    the system's temporary folder) that this process maps without copying.

    With `parts_dir` (a folder the caller removes after `load`), a parser whose tables outgrow its memory budget
    writes them there as Parquet parts (`SpilledTable`), which `load` streams into the store: a multi-GB rank is
    never held whole. Without it every table is held in memory.

    `files` holds paths (format detected) or (path, format) pairs. The parser processes die with this one
    (`_worker_init`) and are killed when it is interrupted or fails.
    """
    options = options or IngestOptions(keep_python=keep_python)
    if parts_dir is not None:
        options = dataclasses.replace(options, spill_dir=str(parts_dir))
    pairs = [f if isinstance(f, tuple) else (f, None) for f in files]
    for p, _ in pairs:  # every input a regular file before any is read (a named pipe or a device never ends)
        regular_file(p)
    if jobs is None:
        jobs = 1 if _input_bytes(pairs) < _SERIAL_BYTES else min(len(pairs), os.cpu_count() or 1)
    if len(pairs) == 1 or jobs <= 1:
        return [_parse_job((str(p), fmt, i, options, None)) for i, (p, fmt) in enumerate(pairs)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    spill = tempfile.mkdtemp(prefix="tracediag-parse-", dir=spill_dir)
    work = [(str(p), fmt, i, options, spill) for i, (p, fmt) in enumerate(pairs)]
    # fork: workers inherit the imported modules (no re-import cost); nothing here holds threads yet.
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        futures = _submit_all(pool, work)
        while not wait(futures, timeout=_POLL_S).done >= set(futures):
            checkpoint()  # a cancelled call ends the parser processes (below) rather than wait for them
        return [_result(f, w[0]) for f, w in zip(futures, work)]
    except BaseException:
        _kill_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(spill, ignore_errors=True)  # the parent's maps of the files stay valid


@contextlib.contextmanager
def parts_folder(beside: str | Path | None = None) -> Iterator[Path]:
    """A folder for parsers' Parquet parts (parse_all `parts_dir`): `<beside>.parts` next to a store file (the
    same disk as the output, as DuckDB's own spill folder), else in the system's temporary folder; removed after."""
    if beside is not None:
        folder = Path(f"{beside}.parts")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="tracediag-parts-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _insert_parts(con: duckdb.DuckDBPyConnection, table: str, spilled: SpilledTable) -> None:
    """Stream a spilled table's Parquet parts into the store (DuckDB reads them a row group at a time)."""
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?)", [list(spilled.files)])
    for f in spilled.files:
        with contextlib.suppress(OSError):
            os.unlink(f)


def load(con: duckdb.DuckDBPyConnection, parsed: list[Parsed]) -> None:
    """Write parsed inputs into the store; two trace files claiming the same rank is an input error."""
    from tracediag.store import append_arrow, append_rows, transaction

    seen: dict[int, str] = {}
    rows = []
    for input_id, pt in enumerate(parsed):
        if pt.format in TRACE_FORMATS:
            for rank in pt.ranks:
                if rank in seen:
                    raise InputError(
                        pt.path,
                        f"rank {rank} was already given by {seen[rank]}; pass the traces of one run, one file per rank",
                    )
                seen[rank] = pt.path
        rows += [{**r, "input_id": input_id, "path": pt.path, "format": pt.format} for r in pt.inputs_rows]
    with transaction(con):  # one commit (a file store syncs its log once)
        append_rows(con, "inputs", rows)
        append_rows(con, "process_groups", [pg for pt in parsed for pg in pt.process_groups])
        by_table: dict[str, list] = {}
        for pt in parsed:
            for name, table in pt.tables.items():
                if isinstance(table, SpilledTable):
                    _insert_parts(con, name, table)
                else:
                    by_table.setdefault(name, []).append(table)
        for name, tables in by_table.items():
            if len(tables) > 1 and all(t.schema == tables[0].schema for t in tables):
                import pyarrow as pa

                tables = [pa.concat_tables(tables)]  # one insert per table (no copy: the chunks are kept)
            for t in tables:
                append_arrow(con, name, t)
