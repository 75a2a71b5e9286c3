"""Dump the tables and meta the vLLM and SGLang log parsers make of every vendored log, and of variants of them
that reach the block reader's edge cases, so that two versions of the parsers can be compared exactly:

    PYTHONPATH=/path/to/old /path/to/old/.venv/bin/python benchmarks/log_tables_dump.py /tmp/old
    PYTHONPATH=$PWD .venv/bin/python benchmarks/log_tables_dump.py /tmp/new
    .venv/bin/python benchmarks/log_tables_dump.py --compare /tmp/old /tmp/new

Inputs: tests/data/external/{vllm,sglang}/log_excerpts/* as they are, and built from them (in a temporary folder):
each log repeated (the stats lines of a long log come in runs), with CRLF line ends, gzipped, with NUL runs where
lines start, hard-wrapped at 80 columns, with the clock set back by an hour halfway, two processes interleaved, a
date change and year rollover, lines longer than the read budget, and the synthetic V1 log of bench_sch003.py
(20,000 lines). Each dump is one Arrow IPC file per table and meta.json per input.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import tempfile
import zlib
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ROOT / "tests" / "data" / "external"


def _stats_lines(n: int, seed: int, proc: str = "APIServer pid=4242", t0: datetime | None = None) -> list[str]:
    rng = random.Random(seed)
    t0 = t0 or datetime(2026, 3, 17, 0, 0, 0)
    out = []
    for i in range(n):
        ts = (t0 + timedelta(seconds=i)).strftime("%m-%d %H:%M:%S")
        out.append(
            f"({proc}) INFO {ts} [loggers.py:259] Engine 000: Avg prompt throughput: {rng.uniform(0, 1100):.1f} "
            f"tokens/s, Avg generation throughput: {rng.uniform(0, 500):.1f} tokens/s, Running: {rng.randint(0, 64)} "
            f"reqs, Waiting: {i // 60 + rng.randint(0, 5)} reqs, GPU KV cache usage: {rng.uniform(0, 99):.1f}%, "
            f"Prefix cache hit rate: {rng.uniform(0, 99):.1f}%"
        )
    return out


def _v0_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    t0 = datetime(2024, 12, 31, 23, 50, 0)  # crosses midnight and the year
    out = []
    for i in range(n):
        ts = (t0 + timedelta(seconds=2 * i)).strftime("%m-%d %H:%M:%S")
        out.append(
            f"INFO {ts} metrics.py:351] Avg prompt throughput: {rng.uniform(0, 900):.1f} tokens/s, Avg generation "
            f"throughput: {rng.uniform(0, 300):.1f} tokens/s, Running: {rng.randint(0, 9)} reqs, Swapped: 0 reqs, "
            f"Pending: {rng.randint(0, 9)} reqs, GPU KV cache usage: {rng.uniform(0, 99):.1f}%, CPU KV cache usage: "
            "0.0%."
        )
        if i % 7 == 3:
            out.append(f"INFO {ts} metrics.py:367] Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%")
    return out


def _sglang_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    t0 = datetime(2025, 12, 31, 23, 30, 0)  # crosses midnight and the year
    out = []
    for i in range(n):
        ts = (t0 + timedelta(seconds=i // 2)).strftime("%Y-%m-%d %H:%M:%S")
        graph = ["cuda graph: True, ", "cuda graph: False, ", ""][i % 3]
        tail = [", ", ",", ""][i % 7 % 3]
        out.append(
            f"[{ts} TP{i % 2}] Decode batch. #running-req: {rng.randint(0, 300)}, #token: {rng.randint(0, 90000)}, "
            f"token usage: {rng.uniform(0, 1):.2f}, {graph}gen throughput (token/s): {rng.uniform(0, 5000):.2f}, "
            f"#queue-req: {rng.randint(0, 50)}{tail}"
        )
        if i % 500 == 7:
            out.append(f'[{ts}] INFO:     127.0.0.1:4242 - "POST /generate HTTP/1.1" 200 OK')
        if i % 1000 == 9:
            out.append(f"[{ts} TP0] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: "
                       "0.01, #running-req: 3, #queue-req: 0, ")  # fmt: skip
    return out


def variants(work: Path) -> list[tuple[str, Path]]:
    """(name, path) of every input: the vendored logs and the variants built from them in `work`."""
    out: list[tuple[str, Path]] = []
    for kind in ("vllm", "sglang"):
        for p in sorted((EXTERNAL / kind / "log_excerpts").iterdir()):
            if p.is_file() and p.name != "README.md":
                out.append((f"{kind}/{p.name}", p))
    rng = random.Random(7)

    def write(name: str, data: bytes) -> None:
        p = work / name
        p.write_bytes(data)
        out.append((f"variant/{name}", p))

    real = [(n, p.read_bytes()) for n, p in list(out)]
    long = "\n".join(_stats_lines(20_000, 1)).encode() + b"\n"
    write("bench_20k.log", long)
    for name, data in real:
        base = name.split("/", 1)[1]
        stats = "\n".join(_stats_lines(40, zlib.crc32(base.encode()) % 1000)).encode() + b"\n"
        body = data if data.endswith(b"\n") else data + b"\n"
        write(f"rep_{base}", stats + body + stats + body * 3 + stats)
        write(f"crlf_{base}", (stats + body + stats).replace(b"\n", b"\r\n"))
        write(f"gz_{base}.gz", gzip.compress(stats + body + stats))
        lines = (stats + body + stats).split(b"\n")
        for i in rng.sample(range(len(lines)), min(5, len(lines))):
            lines[i] = b"\x00" * rng.randint(1, 300) + lines[i]
        write(f"nul_{base}", b"\n".join(lines))
        wrapped = [ln[i : i + 80] for ln in (stats + body).split(b"\n") for i in range(0, max(len(ln), 1), 80)]
        write(f"wrap_{base}", b"\n".join(wrapped))
        write(f"noeol_{base}", (stats + body + stats).rstrip(b"\n"))
    for name, data in real:
        if name.startswith("sglang/"):  # its batch lines repeated: long runs of them, as in a long log
            lines = data.split(b"\n")
            write(f"sgrep_{name[7:]}", b"\n".join(x for ln in lines for x in [ln] * (25 if b" batch" in ln else 1)))
    write("sglang_decode.log", "\n".join(_sglang_lines(5000, 11)).encode())
    a, b = _stats_lines(300, 2, "APIServer pid=1"), _stats_lines(300, 3, "APIServer pid=2")
    write("interleaved.log", "\n".join(x for pair in zip(a, b) for x in pair).encode())
    back = _stats_lines(300, 4) + _stats_lines(300, 5, t0=datetime(2026, 3, 16, 23, 0, 0))
    write("clock_back.log", "\n".join(back).encode())
    restart = _stats_lines(200, 6) + _stats_lines(200, 7, "APIServer pid=99", datetime(2026, 3, 17, 0, 10, 0))
    write("restart.log", "\n".join(restart).encode())
    write("v0_rollover.log", "\n".join(_v0_lines(3000, 8)).encode())
    bad = _stats_lines(100, 9)
    bad[40] = bad[40].replace("00:00:40", "24:00:40")
    bad[41] = bad[41].replace("00:00:41", "00:75:41")
    bad[60] = bad[60].replace("03-17", "13-45")
    bad[70] = bad[70] + "\x1b[0m"
    bad[80] = "\x1b[32m" + bad[80]
    bad[90] = bad[90] + "\n(continued)"
    write("odd_lines.log", ("\n".join(bad) + "\n" + "x" * (3 << 20) + "\n" + "\n".join(bad[:50])).encode())
    mixed = []
    for i, ln in enumerate(_stats_lines(2000, 10)):
        mixed.append(ln)
        if i % 97 == 0:
            mixed.append(f'INFO:     127.0.0.1:5{i:04d} - "POST /v1/completions HTTP/1.1" 200 OK')
        if i % 301 == 0:
            mixed.append("  continued text of a wrapped warning")
    write("mixed.log", "\n".join(mixed).encode())
    return out


def dump(outdir: Path) -> None:
    import pyarrow as pa

    from tracediag.errors import InputError
    from tracediag.ingest import detect_format
    from tracediag.ingest.base import IngestOptions
    from tracediag.ingest.sglang_log import parse_sglang_log
    from tracediag.ingest.vllm_log import parse_vllm_log

    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name, path in variants(Path(d)):
            fmt = detect_format(path)
            target = outdir / re.sub(r"[^\w.-]", "_", name)
            target.mkdir(exist_ok=True)
            parsers = [("vllm", parse_vllm_log), ("sglang", parse_sglang_log)]
            for label, parse in parsers:
                try:
                    parsed = parse(path, 0, IngestOptions())
                except InputError as exc:
                    (target / f"{label}.error").write_text(str(exc).replace(str(path), name) + "\n")
                    continue
                for table, t in parsed.tables.items():
                    sink = pa.OSFile(str(target / f"{label}.{table}.arrow"), "wb")
                    with sink, pa.ipc.new_file(sink, t.schema) as w:
                        w.write_table(t)
                rows = [{k: v for k, v in r.items() if k != "file_bytes"} for r in parsed.inputs_rows]
                (target / f"{label}.meta.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
            (target / "format").write_text(f"{fmt}\n")


def compare(a: Path, b: Path) -> int:
    import pyarrow as pa

    bad = 0
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} | {
        p.relative_to(b) for p in b.rglob("*") if p.is_file()})  # fmt: skip
    for rel in names:
        pa_, pb = a / rel, b / rel
        if not pa_.exists() or not pb.exists():
            print(f"only in one: {rel}")
            bad += 1
            continue
        if rel.suffix == ".arrow":
            ta = pa.ipc.open_file(pa.memory_map(str(pa_))).read_all()
            tb = pa.ipc.open_file(pa.memory_map(str(pb))).read_all()
            if not ta.equals(tb):
                print(f"differs: {rel} ({ta.num_rows} vs {tb.num_rows} rows)")
                bad += 1
        elif pa_.read_bytes() != pb.read_bytes():
            print(f"differs: {rel}")
            bad += 1
    print(f"{len(names)} files compared, {bad} differ")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="+")
    ap.add_argument("--compare", action="store_true", help="compare two dump folders")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.out))
    dump(a.out[0])


if __name__ == "__main__":
    main()
