"""Seed files per input kind: the real inputs vendored in the repository.

Every seed is a real file (tests/data/external/, sample_traces/, tests/data/), except where the repository holds
no real file of a kind: `vllm bench serve` JSON results (the real ones are from an unlicensed repository and are
not vendored), for which the suite's documented synthetic builder (tests/test_ingest_vllm.py `detailed_result`)
writes the seed, alongside any bench file later vendored under tests/data/external/vllm/bench/.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
EXTERNAL = TESTS / "data" / "external"
SAMPLES = REPO / "sample_traces"

# input kind -> the tracediag format name the CLI flag gives it (None: a trace, format detected)
KINDS = (
    "kineto", "nsys", "nccl-tests", "topology", "vllm-log", "sglang-log", "prometheus", "vllm-bench", "sglang-bench",
    "model", "check-toml",
)  # fmt: skip


def _files(*globs: tuple[Path, str]) -> list[Path]:
    out: list[Path] = []
    for base, pattern in globs:
        out += sorted(p for p in base.glob(pattern) if p.is_file())
    return out


@cache
def seed_files(kind: str) -> tuple[Path, ...]:
    """The seed files of one kind (never empty: a kind without seeds is a broken checkout)."""
    found = {
        "kineto": lambda: _files(
            (EXTERNAL / "kineto", "*.json.gz"),
            (EXTERNAL / "kineto" / "capture", "*.json.gz"),
            (SAMPLES, "*/rank*.json.gz"),
        ),
        "nsys": lambda: _files((EXTERNAL / "nsys", "*.sqlite")),
        "nccl-tests": lambda: _files((EXTERNAL / "nccl-tests", "*.txt")),
        "topology": lambda: _files((TESTS / "data" / "topology", "*.json")),
        "vllm-log": lambda: _files((EXTERNAL / "vllm", "log*/*.log")),
        "sglang-log": lambda: _files((EXTERNAL / "sglang", "log*/*.log")),
        "prometheus": lambda: _files((EXTERNAL / "vllm", "metrics/*.prom"), (EXTERNAL / "sglang", "metrics/*.prom")),
        "vllm-bench": lambda: [*_files((EXTERNAL / "vllm", "bench/*")), _synthetic_bench()],
        "sglang-bench": lambda: _files((EXTERNAL / "sglang", "bench/*")),
        "model": lambda: _files((SAMPLES, "*/config.json"), (TESTS / "data", "*_config.json")),
        "check-toml": lambda: _files((TESTS / "data", "check_*.toml")),
    }[kind]()
    if not found:
        raise FileNotFoundError(f"no seed files for {kind} (real inputs: tests/data/external/README.md)")
    return tuple(found)


def _synthetic_bench() -> Path:
    """A `--save-result --save-detailed` JSON from the suite's documented synthetic builder (no real one is
    vendored); written once per process into a cache folder outside the checkout's tracked files."""
    import sys
    import tempfile

    sys.path.insert(0, str(TESTS))
    from test_ingest_vllm import detailed_result

    path = Path(tempfile.gettempdir()) / "tracediag-fuzz-seeds" / "synthetic_bench_detailed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(detailed_result(n=12)))
    return path
