"""The lines of a vLLM log, as patterns: the record prefixes of every layout (RECORD), what starts or continues a
line, the stats fields by name, the events', speculative-decoding and startup messages, and the exact V1/V0 stats
line of the fast paths (_FAST line by line, _FAST_BLOCK for the block reader). vLLM source wording, checked on the
real logs of tests/data/external/vllm/.
"""

from __future__ import annotations

import re

RECORD = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.\-]*(?: [A-Za-z_][\w.\-]*)*?)(?:\s+rank=\d+)?\s+pid=(?P<pid>\d+)\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+)?(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:[.,]\d+)?\s+"
    r"\[?(?P<file>[\w.\-/]+\.py):(?P<lineno>\d+)\]\s?"
    r"|(?P<ydate>\d{4}-\d{2}-\d{2})[ T](?P<ytime>\d{2}:\d{2}:\d{2})(?:[.,]\d+)?\s+-\s+(?P<logger>vllm(?:\.\w+)*)\s+-\s+"
    r"(?P<ylevel>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+-\s+"
    r"|(?<![\w:])(?P<dlevel>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<dlogger>vllm(?:\.\w+)+):"  # logging.BASIC_FORMAT
)
_STARTS_RECORD = re.compile(
    r"^\s*(?:\(|\[|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|/|\w+Error\b|Traceback|\d{4}-\d{2}-\d{2})"
)
_CONTINUES = re.compile(r"^[a-z0-9%]")
_ACCESS = re.compile(r'INFO:\s+(?P<addr>\S+)\s+-\s+"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
_UVICORN = re.compile(
    r"INFO:\s+(?P<msg>(?:Started server process|Waiting for application|Application startup complete|"
    r"Shutting down|Waiting for connections|Application shutdown|Finished server process|"
    r"Uvicorn running).*)"
)

_ENGINE = re.compile(r"^(?:Engine (?P<engine>\d+)|(?P<agg>\d+) Engines Aggregated):\s*(?P<body>.*)$", re.S)
_FIELD = re.compile(
    r"^(?P<key>[A-Za-z][A-Za-z /()_-]*?):\s*(?:active\s+)?(?P<val>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|nan|inf)\s*"
    r"(?P<unit>%|tokens/s|reqs|ms)?"
)
STATS_FIELDS = {
    "throughput": "tput_tok_s",
    "avg prompt throughput": "prompt_tput_tok_s",
    "avg generation throughput": "gen_tput_tok_s",
    "running": "running",
    "waiting": "waiting",
    "pending": "waiting",
    "swapped": "swapped",
    "deferred": "deferred",
    "preemptions": "preemptions",
    "gpu kv cache usage": "kv_usage_pct",
    "kv cache usage": "kv_usage_pct",
    "cpu kv cache usage": "cpu_kv_usage_pct",
    "prefix cache hit rate": "prefix_hit_pct",
    "gpu prefix cache hit rate": "prefix_hit_pct",
    "external prefix cache hit rate": "external_prefix_hit_pct",
    "mm cache hit rate": "mm_hit_pct",
}
INT_FIELDS = {"running", "waiting", "swapped", "deferred", "preemptions"}
_V0_PREFIX_HIT = re.compile(r"^Prefix cache hit rate: GPU: (?P<gpu>\d+(?:\.\d+)?)%, CPU: (?P<cpu>\d+(?:\.\d+)?)%")

_PREEMPT = re.compile(
    r"Sequence group (?P<seq>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode because there is not enough "
    r"KV cache space(?:.*?total_num_cumulative_preemption=(?P<cum>\d+))?",
    re.S,
)
# (kind, pattern): lifecycle and wait messages (FORMATS.md c1-c5). Death, hang and cascade messages are data, in
# tracediag/catalog/engine_failures.json (failures.match), each with the file that prints it.
EVENT_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("shm_broadcast_wait", re.compile(r"No available shared memory broadcast block found in \d+ seconds")),
    ("request_finished", re.compile(r"Finished request \S+")),
    ("health_check", re.compile(r"Called check_health")),
    (
        "shutdown",
        re.compile(r"Shutting down FastAPI HTTP server|Application shutdown complete|Finished server process"),
    ),
    ("ready", re.compile(r"Application startup complete|Starting vLLM (?:API )?server on|Available routes are")),
]
_BANNER = re.compile(
    r"vLLM API server version|Initializing an? (?:V[01] )?LLM engine \(v|Starting vLLM (?:API )?server on"
)
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_SPEC_FIELDS = {
    "acceptance_pct": re.compile(r"(?<!Avg )Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "avg_acceptance_pct": re.compile(r"Avg Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "acceptance_frac": re.compile(r"Draft acceptance rate:\s*" + _NUM + r"\s*(?:,|\.?\s*$)"),
    "system_efficiency": re.compile(r"System efficiency:\s*" + _NUM),
    "num_spec_tokens": re.compile(r"Number of speculative tokens:\s*(\d+)"),
    "accepted_v0": re.compile(r"Number of accepted tokens:\s*(\d+)"),
    "draft_v0": re.compile(r"Number of draft tokens(?: tokens)?:\s*(\d+)"),
    "emitted_v0": re.compile(r"Number of emitted tokens(?: tokens)?:\s*(\d+)"),
    "mean_acceptance_length": re.compile(r"Mean acceptance length:\s*" + _NUM),
    "accepted_tput": re.compile(r"Accepted throughput:\s*" + _NUM),
    "drafted_tput": re.compile(r"Drafted throughput:\s*" + _NUM),
    "accepted": re.compile(r"Accepted:\s*(\d+)\s*tokens"),
    "drafted": re.compile(r"Drafted:\s*(\d+)\s*tokens"),
    "per_position": re.compile(
        r"Per-position acceptance rate:\s*((?:-?\d+(?:\.\d+)?|nan)(?:\s*,\s*(?:-?\d+(?:\.\d+)?|nan))*)"
    ),
}

# Startup facts: (key, regex, group, unit). vLLM source wording, checked on the real logs.
_STARTUP: list[tuple[str, re.Pattern[str], int, str | None]] = [
    ("vllm_version", re.compile(r"vLLM API server version (\S+)"), 1, None),
    ("vllm_version", re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v([^)]+)\)"), 1, None),
    ("vllm_version", re.compile(r"[█▄▀]\s+version (\d+\.\d+[\w.+-]*)\s*$"), 1, None),
    ("architecture", re.compile(r"Resolved architecture: (\w+)"), 1, None),
    ("max_model_len", re.compile(r"Using max model len (\d+)"), 1, "tokens"),
    (
        "max_num_batched_tokens",
        re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"),
        1,
        "tokens",
    ),
    ("kv_cache_tokens", re.compile(r"GPU KV cache size: ([\d,]+) tokens"), 1, "tokens"),
    ("max_concurrency_x", re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"), 1, "x"),
    ("max_concurrency_request_tokens", re.compile(r"Maximum concurrency for ([\d,]+) tokens per request"), 1, "tokens"),
    ("num_gpu_blocks", re.compile(r"num_gpu_blocks is: (\d+)"), 1, "blocks"),
    ("num_gpu_blocks", re.compile(r"# (?:GPU|cuda|npu|xpu) blocks: (\d+)"), 1, "blocks"),
    ("num_cpu_blocks", re.compile(r"# CPU blocks: (\d+)"), 1, "blocks"),
    ("kv_cache_memory_gib", re.compile(r"Available KV cache memory: ([\d.]+) GiB"), 1, "GiB"),
    ("model_weights_gib", re.compile(r"Model loading took ([\d.]+) ?GiB"), 1, "GiB"),
    ("world_size", re.compile(r"rank \d+ in world size (\d+) is assigned as"), 1, None),
    ("attention_backend", re.compile(r"Using (\w+) attention backend"), 1, None),
    ("attention_backend", re.compile(r"Using (.+?) backend on V1 engine"), 1, None),
    ("attention_backend", re.compile(r"^Using (\w+(?:-\d)?) backend\.?$"), 1, None),
    ("flash_attention_version", re.compile(r"Using FlashAttention version (\d+)"), 1, None),
    ("quant_kernel", re.compile(r"(?:Using|Selected) (\w+Kernel) for (\w+)"), 0, None),
    ("platform", re.compile(r"Automatically detected platform (\w+)"), 1, None),
    ("nccl_version", re.compile(r"vLLM is using nccl==([\d.]+)"), 1, None),
    ("custom_all_reduce", re.compile(r"Custom allreduce is (disabled)"), 1, None),
    ("async_scheduling", re.compile(r"Asynchronous scheduling is (enabled|disabled)"), 1, None),
    ("profiler_dir", re.compile(r"Torch profiling enabled\. Traces will be saved to: (\S+)"), 1, None),
]
# key=value pairs of the engine config line worth keeping (vllm/v1/engine/core.py, vllm/engine/llm_engine.py)
_CONFIG_KEYS = (
    "model",
    "dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "quantization",
    "kv_cache_dtype",
    "max_seq_len",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "chunked_prefill_enabled",
    "speculative_config",
    "enforce_eager",
    "block_size",
    "served_model_name",
)
_CONFIG_PAIR = re.compile(r"(?:^|[,(:]\s*)(" + "|".join(_CONFIG_KEYS) + r")=('[^']*'|[^,\s)]+)")
_ARGS_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "kv_cache_dtype",
    "quantization",
    "block_size",
    "speculative_config",
    "num_speculative_tokens",
)
_UNITS = {
    "max_num_seqs": "requests",
    "max_num_batched_tokens": "tokens",
    "max_model_len": "tokens",
    "max_seq_len": "tokens",
}

_OUTER_TIME = re.compile(r"^[-\s\[]*(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})")


# The V1 and V0 stats lines exactly as vLLM writes them, whole line, one record: most lines of a long log. Anything
# else (other fields, glued records, wrappers, wraps) takes the general path.
_FAST = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.\-]*) pid=(?P<pid>\d{1,9})\) )?(?:INFO|DEBUG) (?P<date>\d\d-\d\d) "
    r"(?P<time>\d\d:\d\d:\d\d) \[?[\w.]+\.py:\d+\] (?:Engine (?P<engine>\d{3}): )?"
    r"Avg prompt throughput: (?P<p>\d{1,12}\.\d) tokens/s, Avg generation throughput: (?P<g>\d{1,12}\.\d) tokens/s, "
    r"Running: (?P<r>\d{1,9}) reqs, "
    r"(?:Waiting: (?P<w>\d{1,9})|Swapped: (?P<sw>\d{1,9}) reqs, Pending: (?P<pe>\d{1,9})) reqs, "
    r"GPU KV cache usage: (?P<kv>\d{1,3}\.\d)%, (?:Prefix cache hit rate: (?P<ph>\d{1,3}\.\d)%|"
    r"CPU KV cache usage: (?P<cpu>\d{1,3}\.\d)%\.?)$"
)

# _FAST for the block reader (pyarrow's RE2 over a raw line with its newline): the same groups, ASCII classes
_FAST_BLOCK = (
    r"^(?:\((?P<proc>[A-Za-z_][A-Za-z0-9_.\-]*) pid=(?P<pid>[0-9]{1,9})\) )?(?:INFO|DEBUG) "
    r"(?P<date>[0-9][0-9]-[0-9][0-9]) (?P<time>[0-9][0-9]:[0-9][0-9]:[0-9][0-9]) \[?[A-Za-z0-9_.]+\.py:[0-9]+\] "
    r"(?:Engine (?P<engine>[0-9]{3}): )?Avg prompt throughput: (?P<p>[0-9]{1,12}\.[0-9]) tokens/s, "
    r"Avg generation throughput: (?P<g>[0-9]{1,12}\.[0-9]) tokens/s, Running: (?P<r>[0-9]{1,9}) reqs, "
    r"(?:Waiting: (?P<w>[0-9]{1,9})|Swapped: (?P<sw>[0-9]{1,9}) reqs, Pending: (?P<pe>[0-9]{1,9})) reqs, "
    r"GPU KV cache usage: (?P<kv>[0-9]{1,3}\.[0-9])%, (?:Prefix cache hit rate: (?P<ph>[0-9]{1,3}\.[0-9])%|"
    r"CPU KV cache usage: (?P<cpu>[0-9]{1,3}\.[0-9])%\.?)\r?\n?$"
)
