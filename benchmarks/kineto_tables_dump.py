"""Dump what the Kineto parser makes of every vendored and sample trace (and of variants that reach its edge cases),
so that two versions of the parser can be compared exactly:

    PYTHONPATH=/path/to/old python benchmarks/kineto_tables_dump.py /tmp/old
    PYTHONPATH=$PWD .venv/bin/python benchmarks/kineto_tables_dump.py /tmp/new
    .venv/bin/python benchmarks/kineto_tables_dump.py --compare /tmp/old /tmp/new

Inputs: every `*.json.gz` / `*.pt.trace.json` under sample_traces/ and tests/data/ that parses as Kineto, each
parsed whole-file (the default chunk size: these are small) and in chunks of 64 KiB (the chunked path's cuts, its
tail and the exact-ns switch between chunks), each also as plain JSON when it is gzipped (a plain file is read by
another path than a gzip stream); `--extra FILE` adds large files (the generated pair's ranks). Each dump is one
Arrow IPC file per table (its chunks combined), and meta.json (the inputs row, process groups, and for an input
the parser rejects, its error).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _inputs() -> list[Path]:
    found = []
    for base in (ROOT / "sample_traces", ROOT / "tests" / "data"):
        found += sorted(base.rglob("*.json.gz")) + sorted(base.rglob("*.pt.trace.json"))
    return [f for f in found if "golden" not in f.parts]


def _dump_one(path: Path, out: Path, memory_limit: int | None) -> None:
    import pyarrow as pa

    from tracediag.errors import TracediagError
    from tracediag.ingest import without_pandas
    from tracediag.ingest.base import IngestOptions, SpilledTable
    from tracediag.ingest.kineto import parse_kineto

    out.mkdir(parents=True, exist_ok=True)
    with without_pandas():
        try:
            parsed = parse_kineto(path, 0, IngestOptions(memory_limit=memory_limit))
        except TracediagError as exc:
            (out / "meta.json").write_text(json.dumps({"error": str(exc).replace(str(path), "<input>")}))
            return
    for name, t in parsed.tables.items():
        if isinstance(t, SpilledTable):
            import pyarrow.parquet as pq

            t = pa.concat_tables([pq.read_table(f) for f in t.files])
        with pa.ipc.new_file(out / f"{name}.arrow", t.schema) as w:
            w.write_table(t.combine_chunks())
    rows = [{k: (v if k not in ("path", "file_bytes") else None) for k, v in r.items()} for r in parsed.inputs_rows]
    meta = {"inputs_rows": rows, "process_groups": parsed.process_groups}
    (out / "meta.json").write_text(json.dumps(meta, sort_keys=True, default=str))


def dump(dest: Path, extra: list[Path]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(_inputs() + extra):
            rel = f.relative_to(ROOT) if f.is_relative_to(ROOT) else Path(f.name)
            key = str(rel).replace("/", "__")
            variants = [(f, None)]
            if f not in extra:
                variants.append((f, 1 << 19))  # chunks of 64 KiB: an eighth of the budget
                if f.suffix == ".gz":
                    plain = Path(tmp) / f"{i}.json"
                    plain.write_bytes(gzip.decompress(f.read_bytes()))
                    variants += [(plain, None), (plain, 1 << 19)]
            for j, (path, limit) in enumerate(variants):
                _dump_one(path, dest / key / f"v{j}", limit)
            print(key, file=sys.stderr)


def compare(old: Path, new: Path) -> int:
    import pyarrow as pa

    bad = 0
    cases = sorted(p.relative_to(old) for p in old.glob("*/v*"))
    if cases != sorted(p.relative_to(new) for p in new.glob("*/v*")):
        print("the two dumps hold different inputs")
        return 1
    for case in cases:
        a, b = old / case, new / case
        if json.loads((a / "meta.json").read_text()) != json.loads((b / "meta.json").read_text()):
            print(f"{case}: meta differs")
            bad += 1
        names = sorted(p.name for p in a.glob("*.arrow"))
        if names != sorted(p.name for p in b.glob("*.arrow")):
            print(f"{case}: tables differ: {names}")
            bad += 1
            continue
        for n in names:
            ta = pa.ipc.open_file(a / n).read_all()
            tb = pa.ipc.open_file(b / n).read_all()
            if not ta.equals(tb, check_metadata=True):
                print(f"{case}/{n}: differs ({ta.num_rows} vs {tb.num_rows} rows)")
                bad += 1
    print(f"{len(cases)} parses compared, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", type=Path)
    ap.add_argument("--extra", type=Path, action="append", default=[], help="a large trace to add (parsed once)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.dest is None:
        ap.error("give DEST, or --compare OLD NEW")
    dump(args.dest, [p.resolve() for p in args.extra])
    return 0


if __name__ == "__main__":
    sys.exit(main())
