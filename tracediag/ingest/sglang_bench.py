"""`python -m sglang.bench_serving` results: the `--output-file` JSONL (one result object appended per run) and
the client's stdout table, into the same tables as `vllm bench serve` results (ingest/vllm_bench.py).

Keys (python/sglang/bench_serving.py; python/sglang/benchmark/serving.py in newer versions): backend,
dataset_name, request_rate (a float; an infinite rate is written as the bare JSON token `Infinity`, which Python's
json reads), max_concurrency, random_input_len, random_output_len, duration, completed,
total_input_tokens, total_output_tokens, total_output_tokens_retokenized, request_throughput, input_throughput,
output_throughput, total_throughput, {mean,median,std,p90,p95,p99}_{e2e_latency,ttft,tpot,itl}_ms, concurrency
(Σ latency / duration), accept_length, server_info; with --output-details input_lens, output_lens, ttfts, itls
(seconds), generated_texts, errors. There is no `failed` key and no `num_prompts`: failures are counted from
`errors` when the details are saved, and are otherwise unknown (NULL). The stdout table is the `Serving Benchmark
Result` banner with `Traffic request rate:`, `Successful requests:`, `Mean E2E Latency (ms):` ... rows.
"""

from __future__ import annotations

from pathlib import Path

from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.vllm_bench import parse_bench


def parse_sglang_bench(path: Path, order: int, options: IngestOptions) -> Parsed:
    return parse_bench(path, order, "sglang-bench", options.memory_limit)
