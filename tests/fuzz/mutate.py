"""Mutators: a real seed file + a `random.Random` -> the bytes of a hostile variant of it.

Hostile values are the ones real incidents and the issue tracker produced: integers beyond 64 bits, 401-digit
numbers and 5,000-digit ones (past Python's 4,300-digit conversion limit), 1e30 / NaN / Infinity, 2**40 ranks
and sizes, invalid UTF-8, 1 MiB strings, JSON (and TOML arrays) nested 1,500 deep, blobs or text in integer
columns, SQLite pages that decode to invalid UTF-8. Each mutator applies 1-3 edits, so most variants stay close
to the real file and reach deep into the parser.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gzip
import json
import random
import re
import shutil
import sqlite3
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

# --- hostile values ----------------------------------------------------------------------------------------

DEEP = 1500
HUGE_STRING = 1 << 20
# raw JSON tokens (written verbatim: some are not valid JSON on purpose)
JSON_NUMBERS = [
    b"18446744073709551616", b"9223372036854775808", b"9223372036854775807", b"-9223372036854775809",
    b"1" + b"0" * 400, b"-" + b"9" * 401, b"7" * 5000, b"1e30", b"-1e30", b"1e308", b"1e999", b"-1e999", b"NaN",
    b"Infinity", b"-Infinity", b"1099511627776", b"-1099511627776", b"-1", b"0", b"-0.0", b"4.9e-324", b"0.5",
    b"2147483648", b"4294967296", b"1.7976931348623157e308",
]  # fmt: skip
JSON_STRINGS = [
    b'""', b'"x"', b'"\xff\xfe\xc3"', b'"\\ud800"', b'"12"', b'"0x1f"', b'"nan"', b'"1e999"', b'"-5"',
    b'"\\u0000"', b'"[[1, 2], [3]]"', b'"\xed\xa0\x80"',
]  # fmt: skip
JSON_STRUCTS = [b"null", b"true", b"false", b"[]", b"{}", b"[1, 2, 3]", b"[[1, 2], [3]]", b'[["x"]]', b"[null]"]


def _deep_array() -> bytes:
    return b"[" * DEEP + b"]" * DEEP


def _deep_object() -> bytes:
    return b'{"a": ' * DEEP + b"1" + b"}" * DEEP


def _huge_string() -> bytes:
    return b'"' + b"A" * HUGE_STRING + b'"'


def hostile_json(rnd: random.Random) -> bytes:
    pick = rnd.random()
    if pick < 0.5:
        return rnd.choice(JSON_NUMBERS)
    if pick < 0.75:
        return rnd.choice(JSON_STRINGS)
    if pick < 0.92:
        return rnd.choice(JSON_STRUCTS)
    return rnd.choice((_deep_array, _deep_object, _huge_string))()


TEXT_NUMBERS = [
    "1e30", "-1e30", "nan", "NaN", "inf", "-inf", "Infinity", "1" + "0" * 400, "7" * 5000, "18446744073709551616",
    "9223372036854775808", "-1", "0", "1e999", "N/A", "-", "0x10", "1,000", "²", "٣", "1099511627776", "-0",
    "4.9e-324", "1e-400", "+5", "1_000", "0.0.1", "",
]  # fmt: skip
TEXT_JUNK = [b"\xff\xfe", b"\x00", b"\r", b"\x1b[31m", b"\xc3", b"\xed\xa0\x80", b"\t\t", "\u2028".encode()]


# --- bytes -------------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    """One byte-level edit: truncate, flip, insert, delete or duplicate a range."""
    if not data:
        return bytes(rnd.choice(TEXT_JUNK))
    n = len(data)
    op = rnd.randrange(6)
    i = rnd.randrange(n)
    if op == 0:
        return data[:i]
    if op == 1:
        b = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            b[rnd.randrange(n)] ^= 1 << rnd.randrange(8)
        return bytes(b)
    if op == 2:
        return data[:i] + rnd.choice(TEXT_JUNK) + data[i:]
    if op == 3:
        return data[:i] + data[min(n, i + rnd.randint(1, 64)) :]
    if op == 4:
        j = min(n, i + rnd.randint(1, 4096))
        return data[:j] + data[i:j] * rnd.randint(1, 3) + data[j:]
    return data[:i] + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16))) + data[i:]


# --- JSON --------------------------------------------------------------------------------------------------


class Raw:
    """A JSON token written verbatim by `dump_json`."""

    def __init__(self, token: bytes) -> None:
        self.token = token


def dump_json(doc: Any) -> bytes:
    """json.dumps, with `Raw` tokens spliced in verbatim (invalid JSON, huge numbers, invalid UTF-8)."""
    raws: list[bytes] = []

    def swap(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.token)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(o, dict):
            return {k: swap(v) for k, v in o.items()}
        if isinstance(o, list):
            return [swap(v) for v in o]
        return o

    text = json.dumps(swap(doc)).encode()
    if raws:
        text = re.sub(rb'"\\u0000RAW(\d+)\\u0000"', lambda m: raws[int(m.group(1))], text)
    return text


def _containers(doc: Any, limit: int = 4000) -> list[Any]:
    """Dicts and lists of the document (breadth first, at most `limit`)."""
    out, queue = [], [doc]
    while queue and len(out) < limit:
        o = queue.pop(0)
        if isinstance(o, (dict, list)):
            out.append(o)
            queue.extend(o.values() if isinstance(o, dict) else o)
    return out


def mutate_json_doc(doc: Any, rnd: random.Random, keys: list[str], pick: Callable[[Any], list[Any]] | None = None):
    """One structural edit of a parsed JSON document, in place: set a value (existing or known key) to a hostile
    token, delete a key, duplicate or drop a list element. `pick(doc)` proposes the containers worth hitting."""
    nodes = (pick(doc) if pick else None) or _containers(doc)
    node = rnd.choice(nodes)
    op = rnd.random()
    if isinstance(node, dict):
        if op < 0.75 or not node:
            key = rnd.choice(list(node) + keys) if (node and rnd.random() < 0.6) or not keys else rnd.choice(keys)
            node[key] = Raw(hostile_json(rnd))
        elif op < 0.9:
            node.pop(rnd.choice(list(node)))
        else:
            k = rnd.choice(list(node))
            node[k] = [node[k]] if rnd.random() < 0.5 else {"value": node[k]}
    elif isinstance(node, list):
        if not node or op < 0.5:
            i = rnd.randrange(len(node) + 1)
            node.insert(i, Raw(hostile_json(rnd)))
        elif op < 0.7:
            node[rnd.randrange(len(node))] = Raw(hostile_json(rnd))
        elif op < 0.85:
            i = rnd.randrange(len(node))
            node.insert(i, json.loads(json.dumps(_plain(node[i]))))
        else:
            del node[rnd.randrange(len(node))]


def _plain(o: Any) -> Any:
    if isinstance(o, Raw):
        return None
    if isinstance(o, dict):
        return {k: _plain(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_plain(v) for v in o]
    return o


def _read_maybe_gz(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


@functools.cache
def seed_doc(path: Path) -> Any:
    """The parsed seed (cached: never mutate it, copy what you edit)."""
    return json.loads(_read_maybe_gz(path))


# Kineto: the fields the ingester reads (pytorch/kineto output_json.cpp names), so edits reach them.
KINETO_EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args"]
KINETO_ARG_KEYS = [
    "External id", "device", "stream", "correlation", "grid", "block", "bytes", "Input Dims", "Input type",
    "Collective name", "In msg nelems", "Out msg nelems", "In msg size", "Out msg size", "Group size", "dtype",
    "Process Group Name", "Process Group ID", "Process Group Description", "Process Group Ranks", "Seq",
]  # fmt: skip
KINETO_TOP_KEYS = ["distributedInfo", "deviceProperties", "traceEvents", "rank", "world_size", "pg_config",
                   "backend", "pg_size", "ranks", "totalGlobalMem", "numSms", "computeMajor", "id"]  # fmt: skip


def _kineto_window(doc: Any, rnd: random.Random, max_events: int) -> Any:
    """A copy of a contiguous window of the real events (the seed stays real, the variant stays small)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if isinstance(events, list) and len(events) > max_events:
        i = rnd.randrange(len(events) - max_events + 1)
        events = events[i : i + max_events]
    events = copy.deepcopy(events)
    if isinstance(doc, dict):
        return {k: events if k == "traceEvents" else copy.deepcopy(v) for k, v in doc.items()}
    return events


def _kineto_pick(doc: Any) -> list[Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    out: list[Any] = []
    if isinstance(events, list):
        for e in events[:: max(1, len(events) // 200)]:
            if isinstance(e, dict):
                out.append(e)
                if isinstance(e.get("args"), dict):
                    out.append(e["args"])
    if isinstance(doc, dict):
        for k in ("distributedInfo", "deviceProperties"):
            v = doc.get(k)
            if isinstance(v, (dict, list)):
                out += _containers(v, 50)
    return out


def mutate_kineto(seed: Path, rnd: random.Random, max_events: int = 300) -> bytes:
    doc = _kineto_window(seed_doc(seed), rnd, max_events)
    for _ in range(rnd.randint(1, 3)):
        r = rnd.random()
        keys = KINETO_ARG_KEYS if r < 0.5 else KINETO_EVENT_KEYS + KINETO_TOP_KEYS
        mutate_json_doc(doc, rnd, keys, _kineto_pick if r < 0.85 else None)
    data = dump_json(doc)
    if rnd.random() < 0.15:
        data = mutate_bytes(data, rnd)
    if rnd.random() < 0.3:
        data = gzip.compress(data, compresslevel=1)
    return data


def mutate_json_file(seed: Path, rnd: random.Random, keys: list[str]) -> bytes:
    doc = copy.deepcopy(seed_doc(seed))
    for _ in range(rnd.randint(1, 3)):
        mutate_json_doc(doc, rnd, keys)
    data = dump_json(doc)
    if rnd.random() < 0.15:
        data = mutate_bytes(data, rnd)
    return data


TOPOLOGY_KEYS = ["schema", "gpus", "pairs", "index", "pci_bus_id", "nvlinks", "link", "state", "version",
                 "remote_pci_bus_id", "remote_type", "memory", "total_bytes", "used_bytes", "clocks_mhz", "pcie",
                 "gen", "width", "a", "b", "p2p", "read", "write", "nvlink", "numa_node", "cpu_affinity", "nvml",
                 "available", "tool", "errors", "host", "name"]  # fmt: skip
MODEL_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "head_dim", "vocab_size", "torch_dtype", "dtype", "quantization_config", "bits", "group_size",
              "quant_method", "text_config", "n_embd", "n_layer", "n_head", "architectures", "model_type",
              "num_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank", "sliding_window",
              "tie_word_embeddings", "max_position_embeddings"]  # fmt: skip
BENCH_KEYS = ["completed", "failed", "duration", "request_rate", "request_throughput", "ttfts", "itls",
              "input_lens", "output_lens", "errors", "start_times", "mean_ttft_ms", "p99_tpot_ms", "max_concurrency",
              "num_prompts", "burstiness", "total_input_tokens", "total_output_tokens"]  # fmt: skip
# python -m sglang.bench_serving --output-file: the fields of its JSONL records (the vendored 0.5.23 results)
SGLANG_BENCH_KEYS = [*BENCH_KEYS, "backend", "dataset_name", "random_input_len", "random_output_len",
                     "total_output_tokens_retokenized", "output_throughput", "mean_e2e_latency_ms",
                     "median_ttft_ms", "p99_itl_ms", "concurrency", "generated_texts", "server_info"]  # fmt: skip


def mutate_jsonl(data: bytes, rnd: random.Random, keys: list[str]) -> bytes:
    """JSON Lines (one result per run): 1-3 structural edits of the parsed records, a record duplicated (a second
    run appended) or dropped; lines that are not JSON are kept as they are."""
    lines = data.split(b"\n")
    docs = [(i, json.loads(ln)) for i, ln in enumerate(lines) if ln.strip().startswith(b"{")]
    if not docs:
        return mutate_text(data, rnd)
    for _ in range(rnd.randint(1, 3)):
        i, doc = rnd.choice(docs)
        r = rnd.random()
        if r < 0.8:
            mutate_json_doc(doc, rnd, keys)
        elif r < 0.9:
            lines.append(dump_json(_plain(doc)))
        else:
            lines[i] = b""
            continue
        lines[i] = dump_json(doc)
    data = b"\n".join(lines)
    if rnd.random() < 0.15:
        data = mutate_bytes(data, rnd)
    return data


# --- text (logs, metrics, nccl-tests, bench tables) ---------------------------------------------------------

_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def mutate_text(data: bytes, rnd: random.Random) -> bytes:
    """1-3 line edits: a number replaced by a hostile one, a line deleted/duplicated/swapped/cut/repeated,
    junk bytes or a 1 MiB line inserted; sometimes a byte edit on top."""
    lines = data.split(b"\n")
    for _ in range(rnd.randint(1, 3)):
        if not lines:
            lines = [b""]
        i = rnd.randrange(len(lines))
        op = rnd.random()
        if op < 0.55:
            nums = list(_NUMBER.finditer(lines[i]))
            if not nums:  # find a line with numbers
                cands = [j for j, ln in enumerate(lines) if _NUMBER.search(ln)]
                if cands:
                    i = rnd.choice(cands)
                    nums = list(_NUMBER.finditer(lines[i]))
            if nums:
                m = rnd.choice(nums)
                lines[i] = lines[i][: m.start()] + rnd.choice(TEXT_NUMBERS).encode() + lines[i][m.end() :]
        elif op < 0.62:
            del lines[i]
        elif op < 0.7:
            lines.insert(i, lines[i])
        elif op < 0.76:
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op < 0.82:
            lines[i] = lines[i][: rnd.randrange(len(lines[i]) + 1)]
        elif op < 0.9:
            pos = rnd.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:pos] + rnd.choice(TEXT_JUNK) + lines[i][pos:]
        elif op < 0.95:  # a line repeated (up to 2000 times, at most 4 MiB in all)
            lines[i:i] = [lines[i]] * rnd.randint(2, max(2, min(2000, (4 << 20) // (len(lines[i]) + 1))))
        elif rnd.random() < 0.5:
            lines.insert(i, b"x" * HUGE_STRING)
        else:  # a line grown by 1 MiB of its own last character ("====…", "key=xxxx…"): regexes that restart
            lines[i] += (lines[i][-1:] or b"x") * HUGE_STRING  # at every character of a run are quadratic on it
    data = b"\n".join(lines)
    if rnd.random() < 0.15:
        data = mutate_bytes(data, rnd)
    return data


# --- TOML (tracediag check config) ------------------------------------------------------------------------

TOML_VALUES = [
    "18446744073709551616", "1" + "0" * 400, "7" * 5000, "nan", "inf", "-inf", "1e999", "-1", "0", "1e30", '""', '"x"',
    '"nan"', "[]", "{}", "[1, 2]", '["COL*", 5]', "true", '"\\u0000"', '"' + "A" * 10000 + '"', "1979-05-27",
    '[{rule = "run"}]', '{prefill = 3}', "[" * 1500 + "]" * 1500, '"COL*,,"', '"[" ', "9223372036854775807",
    "-9223372036854775808",
]  # fmt: skip
TOML_KEYS = ["rules", "fail_on", "expected_tp", "expected_attention_family", "regression_severity", "tolerances",
             "expect", "collective_count_slack", "payload_tolerance", "max_evidence", "hbm_bandwidth_gbs",
             "peak_tflops", "slo", "tp1_baseline", "step_time", "impact", "rule", "value", "equals", "one_of",
             "min", "max", "severity", "name"]  # fmt: skip


def mutate_toml(data: bytes, rnd: random.Random) -> bytes:
    """1-3 edits of `key = value` lines (hostile value, other known key, new line), or bytes."""
    lines = data.decode("utf-8", "replace").split("\n")
    for _ in range(rnd.randint(1, 3)):
        assigns = [i for i, ln in enumerate(lines) if re.match(r"^\s*[\w.]+\s*=", ln)]
        op = rnd.random()
        if assigns and op < 0.6:
            i = rnd.choice(assigns)
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {rnd.choice(TOML_VALUES)}"
        elif assigns and op < 0.75:
            i = rnd.choice(assigns)
            lines[i] = f"{rnd.choice(TOML_KEYS)} = {lines[i].split('=', 1)[1]}"
        elif op < 0.9:
            lines.insert(rnd.randrange(len(lines) + 1), f"{rnd.choice(TOML_KEYS)} = {rnd.choice(TOML_VALUES)}")
        else:
            lines.insert(rnd.randrange(len(lines) + 1), rnd.choice(["[tolerances]", "[[expect]]", "[tool]", "["]))
    data = "\n".join(lines).encode()
    if rnd.random() < 0.15:
        data = mutate_bytes(data, rnd)
    return data


def toml_parses(data: bytes) -> bool:
    try:
        tomllib.loads(data.decode())
        return True
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False


# --- SQLite (Nsight Systems exports) ----------------------------------------------------------------------

SQL_VALUES = [
    "x'00ff10'", "'text'", "''", "9223372036854775807", "-9223372036854775808", str(2**62), str(2**40), "1e308",
    "-1e308", "0.5", "NULL", "x'" + "ab" * 64 + "'", f"'{'A' * 100000}'", "CAST(x'fffe41c3' AS TEXT)", "-1", "0",
    "'0x10'", "'12'", "x''",
]  # fmt: skip
_NSYS_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "StringIds",
                "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE", "META_DATA_EXPORT", "EXPORT_META_DATA",
                "NVTX_PAYLOAD_SCHEMA_ENTRIES", "NVTX_PAYLOAD_ENUM_ENTRIES", "MPI_RANKS", "PROCESSES",
                "ENUM_CUDA_MEM_KIND", "ENUM_NSYS_EVENT_CLASS")  # fmt: skip


_ACTIVITY_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")


@functools.cache
def trimmed_export(seed: Path, rows: int = 300) -> Path:
    """A copy of a real export with its activity tables (CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS) cut to their first
    `rows` rows — a window of the real capture, like `_kineto_window` — so a variant parses in milliseconds."""
    import tempfile

    out = Path(tempfile.gettempdir()) / "tracediag-fuzz-seeds" / f"trimmed{rows}_{seed.name}"
    if out.exists() and out.stat().st_mtime >= seed.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    shutil.copyfile(seed, tmp)
    con = sqlite3.connect(tmp)
    try:
        for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            if t.startswith(_ACTIVITY_PREFIXES):
                con.execute(
                    f'DELETE FROM "{t}" WHERE rowid NOT IN (SELECT rowid FROM "{t}" ORDER BY rowid LIMIT {rows})'
                )
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    tmp.replace(out)
    return out


def mutate_sqlite(seed: Path, out: Path, rnd: random.Random, trim: bool = True) -> None:
    """Copy the export to `out` and apply 1-3 edits: cells set to hostile values (blobs and text in integer
    columns, extreme integers and floats, invalid UTF-8 text), rows deleted, a table dropped or emptied, a column
    dropped; or raw page bytes corrupted. With `trim`, most variants start from `trimmed_export(seed)`."""
    if trim and rnd.random() < 0.9:
        seed = trimmed_export(seed)
    shutil.copyfile(seed, out)
    if rnd.random() < 0.15:
        data = bytearray(out.read_bytes())
        page = int.from_bytes(data[16:18], "big") or 4096
        for _ in range(rnd.randint(1, 6)):
            i = rnd.randrange(100, len(data))
            if rnd.random() < 0.5:
                data[i] = rnd.randrange(256)
            else:  # text bytes that are not UTF-8
                data[i : i + 2] = b"\xff\xfe"
        if rnd.random() < 0.2:
            data = data[: max(page, (rnd.randrange(len(data)) // page) * page)]
        out.write_bytes(bytes(data))
        return
    con = sqlite3.connect(out)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        favoured = [t for t in tables if t in _NSYS_TABLES]
        for _ in range(rnd.randint(1, 3)):
            table = rnd.choice(favoured if favoured and rnd.random() < 0.85 else tables)
            # an edit the schema forbids (INTEGER PRIMARY KEY set to text, a column under an index) is skipped
            with contextlib.suppress(sqlite3.Error):
                _edit_table(con, table, rnd)
        con.commit()
    finally:
        con.close()


def _edit_table(con: sqlite3.Connection, table: str, rnd: random.Random) -> None:
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
    if not cols:
        return
    op = rnd.random()
    n = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    if op < 0.75 and n:
        col = rnd.choice(cols)
        value = rnd.choice(SQL_VALUES)
        where = ""  # every row (not for the 100,000-character text: a 1.7 GB export says nothing new)
        if rnd.random() < 0.7 or len(value) > 1000:  # a few rows, chosen by `rnd` (reproducible)
            rowids = [r[0] for r in con.execute(f'SELECT rowid FROM "{table}" ORDER BY rowid')]
            chosen = rnd.sample(rowids, min(len(rowids), rnd.randint(1, 5)))
            where = f" WHERE rowid IN ({', '.join(map(str, chosen))})"
        con.execute(f'UPDATE "{table}" SET "{col}" = {value}{where}')
    elif op < 0.85 and n:
        con.execute(f'DELETE FROM "{table}" WHERE rowid % {rnd.randint(2, 5)} = 0')
    elif op < 0.9:
        con.execute(f'DELETE FROM "{table}"')
    elif op < 0.95:
        con.execute(f'DROP TABLE "{table}"')
    elif len(cols) > 1:
        con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{rnd.choice(cols)}"')


# --- never-ending and oversized files ----------------------------------------------------------------------

# what a file argument can be besides a file's content: a named pipe (blocks until a writer comes), a character
# device (/dev/zero never ends), a real file followed by a hole (GiBs of NULs on no disk), a gzip bomb (the real
# file as one member, then members of its last line repeated: ~1000x per member)
ENDLESS_SHAPES = ("fifo", "char-device", "sparse", "gzip-bomb")
SPARSE_SIZES = (65 << 20, 3 << 30)
BOMB_SIZES = (24 << 20, 160 << 20)


def endless_or_oversized(seed: Path, out: Path, rnd: random.Random, shape: str | None = None) -> Path:
    """Write `out` as one of ENDLESS_SHAPES made from the real `seed` (`shape`, else drawn); returns `out`."""
    import os

    shape = shape or rnd.choice(ENDLESS_SHAPES)
    if shape == "fifo":
        os.mkfifo(out)
    elif shape == "char-device":
        out.symlink_to("/dev/zero")  # no privilege needed: readers follow links
    elif shape == "sparse":
        shutil.copyfile(seed, out)
        with open(out, "r+b") as f:
            f.truncate(max(rnd.choice(SPARSE_SIZES), f.seek(0, 2)))
    elif shape == "gzip-bomb":
        data = seed.read_bytes()
        line = (data.rstrip(b"\n").rsplit(b"\n", 1)[-1] or b"x") + b"\n"
        block = gzip.compress(line * max(1, (4 << 20) // len(line)), compresslevel=9)
        with open(out, "wb") as f:
            f.write(gzip.compress(data, compresslevel=1))
            for _ in range(rnd.choice(BOMB_SIZES) // (4 << 20)):
                f.write(block)
    else:
        raise ValueError(f"unknown shape {shape}")
    return out


# --- one entry point per kind ------------------------------------------------------------------------------


def mutate(kind: str, seed: Path, out_dir: Path, rnd: random.Random, max_events: int = 300) -> Path:
    """Write one mutated variant of `seed` into out_dir; returns its path (named like the seed's kind)."""
    if kind == "nsys":
        out = out_dir / "export.sqlite"
        mutate_sqlite(seed, out, rnd)
        return out
    if kind == "kineto":
        data = mutate_kineto(seed, rnd, max_events)
        name = "rank0.pt.trace.json.gz" if data[:2] == b"\x1f\x8b" else "rank0.pt.trace.json"
    elif kind == "topology":
        data, name = mutate_json_file(seed, rnd, TOPOLOGY_KEYS), "topo.json"
    elif kind == "model":
        data, name = mutate_json_file(seed, rnd, MODEL_KEYS), "config.json"
    elif kind == "vllm-bench":
        raw = seed.read_bytes()
        if raw.lstrip()[:1] in (b"{", b"["):
            data = mutate_json_file(seed, rnd, BENCH_KEYS) if rnd.random() < 0.7 else mutate_text(raw, rnd)
        else:
            data = mutate_text(raw, rnd)
        name = "bench.json"
    elif kind == "sglang-bench":
        raw = seed.read_bytes()
        data = mutate_jsonl(raw, rnd, SGLANG_BENCH_KEYS) if raw.lstrip()[:1] == b"{" else mutate_text(raw, rnd)
        name = "bench.jsonl" if raw.lstrip()[:1] == b"{" else "bench_stdout.log"
    elif kind == "check-toml":
        data, name = mutate_toml(seed.read_bytes(), rnd), "tracediag.toml"
    elif kind in ("nccl-tests", "vllm-log", "sglang-log", "prometheus"):
        data = mutate_text(seed.read_bytes(), rnd)
        name = {"nccl-tests": "all_reduce_perf.txt", "vllm-log": "server.log", "sglang-log": "sglang_server.log",
                "prometheus": "metrics.prom"}[kind]  # fmt: skip
    else:
        raise ValueError(f"unknown fuzz kind {kind}")
    out = out_dir / name
    out.write_bytes(data)
    return out
