"""derive/collective_calls.sql finds the calls holding each collective event with ASOF joins; the range
self-join it replaced (tests/reference/collective_calls_rangejoin.sql) must give the same rows on every
sample trace, every vendored real trace and the 8-rank fleet sample.

Both run on the same ingested tables (the canonical tables plus the core derivations that classify them);
`coll_calls` — one row per collective call before payload arithmetic — is compared as a multiset of rows,
every column, NULLs equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXTERNAL, REPO, SAMPLES

from tracediag.derive import build_order
from tracediag.ingest import discover_inputs, load, parse_all
from tracediag.store import open_store, run_sql_file

REFERENCE = REPO / "tests" / "reference" / "collective_calls_rangejoin.sql"

SAMPLE_DIRS = sorted(p for p in SAMPLES.iterdir() if p.is_dir() and list(p.glob("*.json*")))
EXTERNAL_TRACES = sorted((EXTERNAL / "kineto").glob("*.json.gz")) + sorted((EXTERNAL / "nsys").glob("*.sqlite"))
FLEET = REPO / "tests" / "data" / "fleet" / "healthy_tp8"
# external traces that are not one run of one rank set: each file alone
CASES = [pytest.param([d], id=f"sample-{d.name}") for d in SAMPLE_DIRS]
CASES += [pytest.param([f], id=f"external-{f.name.split('.')[0]}") for f in EXTERNAL_TRACES]
CASES += [pytest.param([FLEET], id="fleet-healthy_tp8")]


def _calls(con, sql_text: str | None) -> str:
    if sql_text is None:
        run_sql_file(con, "tracediag.derive", "collective_calls.sql")
    else:
        con.execute(sql_text)
    name = "calls_new" if sql_text is None else "calls_ref"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM coll_calls")
    return name


def test_reference_is_the_range_join_form():
    ref = REFERENCE.read_text()
    assert "i.ts_ns >= c.ts_ns AND i.end_ns <= c.end_ns" in ref and "ASOF JOIN" not in ref
    new = (REPO / "tracediag" / "derive" / "collective_calls.sql").read_text()
    assert "ASOF JOIN" in new and "i.end_ns <= c.end_ns" not in new


@pytest.mark.parametrize("inputs", CASES)
def test_asof_collective_calls_equal_the_range_join(inputs: list[Path]):
    files = [(f, None) for f in discover_inputs(inputs)]
    con = open_store()
    try:
        load(con, parse_all(files))
        for d in build_order():  # the derivations collectives.py runs after
            if "collectives" in d.provides:
                break
            d.run(con)
        ref = _calls(con, REFERENCE.read_text())
        new = _calls(con, None)
        n_ref = con.execute(f"SELECT count(*) FROM {ref}").fetchone()[0]
        n_new = con.execute(f"SELECT count(*) FROM {new}").fetchone()[0]
        only_ref = con.execute(f"SELECT count(*) FROM (SELECT * FROM {ref} EXCEPT ALL SELECT * FROM {new})").fetchone()
        only_new = con.execute(f"SELECT count(*) FROM (SELECT * FROM {new} EXCEPT ALL SELECT * FROM {ref})").fetchone()
        assert (n_new, only_ref[0], only_new[0]) == (n_ref, 0, 0)
        kernels = con.execute("SELECT count(*) FROM kernels WHERE klass = 'collective'").fetchone()[0]
        ops = con.execute("SELECT count(*) FROM cpu_ops WHERE klass = 'collective'").fetchone()[0]
        if kernels or ops:
            assert n_ref > 0, "a trace with collective events must give calls (the comparison would be empty)"
    finally:
        con.close()


def test_overlapping_outer_calls_and_edge_cases_equal_the_range_join():
    """Cases the real traces do not hold, on hand-built table rows (a synthetic builder: no trace has them):
    two outermost calls on one thread that overlap without nesting (a range and a kernel launch held by
    both), a call without a duration, a thread-less call, a kernel launched outside every call, a kernel
    without its runtime launch record."""
    con = open_store()
    try:
        ops = [  # rank, tid, name, ts, dur, collective_op, in_nelems, seq
            (0, "1", "c10d::allreduce_", 0, 100, "all_reduce", None, None),
            (0, "1", "c10d::allreduce_", 50, 100, "all_reduce", None, None),  # overlaps the first
            (0, "1", "record_param_comms", 60, 30, "all_reduce", 1024, 7),  # inside both
            (0, "1", "c10d::broadcast_", 300, None, "broadcast", 8, None),  # no duration
            (0, None, "c10d::allgather_", 400, 10, "all_gather", 4, None),  # no thread
            (0, "1", "c10d::allreduce_", 500, 20, "all_reduce", 16, 8),
            (1, "1", "c10d::allreduce_", 0, 100, "all_reduce", 1024, 7),
        ]
        con.executemany(
            "INSERT INTO cpu_ops (rank, tid, name, ts_ns, dur_ns, collective_op, in_nelems, seq, klass) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'collective')",
            ops,
        )
        kernels = [
            (0, "ncclKernel_AllReduce", 1000, 50, 1),
            (0, "ncclKernel_AllReduce", 2000, 50, 2),
            (0, "ncclKernel_AllReduce", 3000, 50, 3),
            (1, "ncclKernel_AllReduce", 1000, 40, 1),
        ]
        con.executemany(
            "INSERT INTO kernels (rank, name, ts_ns, dur_ns, correlation, klass, collective_op) "
            "VALUES (?, ?, ?, ?, ?, 'collective', 'all_reduce')",
            kernels,
        )
        con.executemany(
            "INSERT INTO runtime (rank, name, tid, ts_ns, dur_ns, correlation) "
            "VALUES (?, 'cudaLaunchKernel', ?, ?, 5, ?)",
            [(0, "1", 70, 1), (0, "1", 200, 2), (1, "1", 100, 1)],  # correlation 3: no launch record
        )
        ref = _calls(con, REFERENCE.read_text())
        new = _calls(con, None)
        rows = lambda t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall()))  # noqa: E731
        assert rows(new) == rows(ref)
        # the kernel launched at 70 lies in both overlapping calls; the one at 200 and the one without a
        # launch record are calls of their own
        held = con.execute(f"SELECT count(*) FROM {new} WHERE kernel_count = 1 AND cpu_dur_ns = 100").fetchone()[0]
        assert held == 3  # both rank-0 calls and rank 1's
        assert con.execute(f"SELECT count(*) FROM {new} WHERE cpu_dur_ns IS NULL").fetchone()[0] == 2
    finally:
        con.close()
