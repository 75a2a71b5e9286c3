"""What a run can be given, declared once: for each input its argument name (the library's keyword and the MCP
tools' argument), its command-line flag, its tracediag.toml key, its kind, bounds, unit and meaning.

The CLI's options (tracediag/cli/options.py), the MCP tools' parameter descriptions (tracediag/agent/server.py),
the validation of `tracediag.request.Request` and the coverage advice ("pass --topology …", or the `topology`
argument to an agent) all read this table, so that an input is named and bounded the same way everywhere; and the
one check of a path argument (`checked_path`), which the MCP server's roots apply too. A leaf: it imports only
tracediag.errors, so that tracediag.findings (the coverage) can read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracediag.errors import UsageError

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer argument is no file name


@dataclass(frozen=True)
class InputSpec:
    name: str  # the keyword of tracediag.analyze and the MCP tools' argument
    flag: str  # the command-line option ("TRACES" for the positional argument)
    kind: str  # paths, path, int, float, bool, text, size
    help: str  # what it is, for the CLI's --help and the MCP parameter description
    metavar: str = ""
    config_key: str | None = None  # its key in tracediag.toml / [tool.tracediag], when a file may give it
    bounds: tuple[float, float] | None = None  # inclusive, for int and float
    unit: str | None = None
    ingest_format: str | None = None  # side inputs: the ingester that reads it (tracediag.ingest)


# The CLI's bounds: a degree beyond the largest deployments, a job count beyond any machine, rates beyond any GPU.
TP_BOUNDS = (1, 4096)
JOBS_BOUNDS = (1, 1024)
RATE_BOUNDS = (0.001, 100_000)

INPUTS: tuple[InputSpec, ...] = (
    InputSpec("traces", "TRACES", "paths", "profiler traces (Kineto .json/.json.gz, nsys .sqlite) or folders of "
              "them, one file per rank", "TRACES"),
    InputSpec("model", "--model", "path", "the served model's Hugging Face config.json", "FILE"),
    InputSpec("tp", "--tp", "int", "tensor-parallel degree (1 to 4096); overrides what the trace says", "N",
              bounds=TP_BOUNDS),
    InputSpec("log", "--log", "paths", "vLLM / SGLang engine or server logs", "FILE", ingest_format="vllm-log"),
    InputSpec("metrics", "--metrics", "paths", "vLLM / SGLang /metrics scrapes (Prometheus text)", "FILE",
              ingest_format="prometheus"),
    InputSpec("bench", "--bench", "paths", "`vllm bench serve` result JSON", "FILE", ingest_format="vllm-bench"),
    InputSpec("nccl_tests", "--nccl-tests", "paths", "nccl-tests output (all_reduce_perf …)", "FILE",
              ingest_format="nccl-tests"),
    InputSpec("topology", "--topology", "paths", "`tracediag env` snapshot JSON (GPUs, links, NICs)", "FILE",
              ingest_format="topology"),
    InputSpec("slo", "--slo", "text", "latency budgets in ms, e.g. ttft=500,tpot=50,e2el=10000", "BUDGETS",
              config_key="slo", unit="ms"),
    InputSpec("hbm_bandwidth", "--hbm-bandwidth", "float", "GPU memory bandwidth, GB/s (> 0, ≤ 1e5)", "GB/S",
              config_key="hbm_bandwidth_gbs", bounds=RATE_BOUNDS, unit="GB/s"),
    InputSpec("peak_tflops", "--peak-tflops", "float", "GPU dense peak for the activation dtype, TFLOP/s (> 0, "
              "≤ 1e5)", "TF/S", config_key="peak_tflops", bounds=RATE_BOUNDS, unit="TFLOP/s"),
    InputSpec("tp1_baseline", "--tp1-baseline", "path", "a TP=1 trace of the same model (COL003's projection, "
              "KRN007's GEMM rates)", "TRACE", config_key="tp1_baseline"),
    InputSpec("graph_capture", "--graph-capture", "path", "the trace of the CUDA/HIP graph capture beside its "
              "replay: replayed kernels get their capturing ops", "TRACE", config_key="graph_capture"),
    InputSpec("ranks", "--ranks", "text", "ranks that get the deep per-kernel analysis: 'all' or a list like "
              "0,3,8-15 (default: every rank when there are at most 8, else one per TP group plus the stragglers)",
              "RANKS"),
    InputSpec("keep_python", "--keep-python", "bool", "also store python_function events"),
    InputSpec("memory_limit", "--memory-limit", "size", "memory budget of each parser process and of DuckDB, e.g. "
              "512MiB, 2GiB (default 512MiB)", "SIZE"),
    InputSpec("jobs", "--jobs", "int", "parallel parser processes (default: one per rank file, up to the cores)",
              "N", bounds=JOBS_BOUNDS),
)  # fmt: skip

BY_NAME = {s.name: s for s in INPUTS}
BY_FLAG = {s.flag: s for s in INPUTS}


def advice(flag_form: str, audience: str = "cli") -> str:
    """How `audience` passes the input a coverage line names in its CLI form ("--topology topo.json"): the CLI
    flag as written; for an agent ("mcp") the tool argument (`topology` (topo.json)); for the notebook API
    ("python") the keyword (topology=…). An input with a tracediag.toml key also says it ("or slo in
    tracediag.toml")."""
    flag, _, example = flag_form.partition(" ")
    spec = BY_FLAG.get(flag)
    if spec is None or audience == "cli":
        shown = flag_form
    elif audience == "mcp":
        shown = f"the `{spec.name}` argument" + (f" ({example})" if example else "")
    else:
        shown = f"{spec.name}=" + (f"'{example}'" if example else "…")
    if spec is not None and spec.config_key is not None:
        shown += f" (or {spec.config_key} in tracediag.toml)"
    return shown


def checked_path(label: str, value: object) -> Path:
    """`value` (text or a Path) as a path, or a UsageError naming the input `label`: not a path, empty, a NUL byte,
    too long for any file system."""
    if not isinstance(value, (str, Path)):
        raise UsageError(f"{label}: a path must be a string, got {type(value).__name__}")
    text = str(value)
    if not text.strip():
        raise UsageError(f"{label}: empty path")
    if "\x00" in text:
        raise UsageError(f"{label}: the path holds a NUL byte; no file has such a name")
    if len(text) > MAX_PATH_CHARS:
        raise UsageError(f"{label}: a path of {len(text):,} characters (at most {MAX_PATH_CHARS:,}) is no file name")
    return Path(value)
