"""A Parquet store changed after `tracediag ingest` is refused as "not a tracediag store", naming the file (issue 38:
read-back stores are data); and a store of more than 1,024 ranks is written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES

from tracediag.errors import InputError
from tracediag.fleet import ingest_store, open_store_views

FILE = "tables/cpu_ops/rank=0/input-0-0.parquet"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("store") / "s"
    ingest_store([SAMPLES / "healthy_tp2"], s)
    assert (s / FILE).is_file()
    return s


def _rewrite(s: Path, edit) -> Path:
    p = s / FILE
    pq.write_table(edit(pq.read_table(p)), p)
    return p


def _dur_as_text(t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("dur_ns")
    return t.set_column(i, "dur_ns", pc.cast(t["dur_ns"], pa.string()))


def _extra_partition(s: Path) -> Path:
    d = s / "tables/cpu_ops/rank=7"
    d.mkdir()
    shutil.copy(s / FILE, d / "x.parquet")
    return s / "tables/cpu_ops"


def _fifo(s: Path) -> Path:
    os.mkfifo(s / "tables/cpu_ops/rank=0/pipe.parquet")
    return s / "tables/cpu_ops/rank=0/pipe.parquet"


def _link_out(s: Path) -> Path:
    os.symlink("/etc/hostname", s / "tables/cpu_ops/rank=0/x.parquet")
    return s / "tables/cpu_ops/rank=0/x.parquet"


def _bad_partition(s: Path) -> Path:
    d = s / "tables/cpu_ops/rank=abc"
    d.mkdir()
    shutil.copy(s / FILE, d / "x.parquet")
    return d


def _text_file(s: Path) -> Path:
    (s / "tables/cpu_ops/rank=0/notes.txt").write_text("x")
    return s / "tables/cpu_ops/rank=0/notes.txt"


def _extra_file(s: Path) -> Path:
    pq.write_table(pq.read_table(s / FILE).slice(0, 5), s / "tables/cpu_ops/rank=0/more.parquet")
    return s / "tables/cpu_ops"


CASES = {
    "a file without a column": (lambda s: _rewrite(s, lambda t: t.drop(["dur_ns"])), "columns are not the table's"),
    "a column of another type": (lambda s: (_rewrite(s, _dur_as_text), s / "tables/cpu_ops")[1], "dur_ns is VARCHAR"),
    "a file of rows added": (_extra_file, "rows, the manifest"),
    "a partition added": (_extra_partition, "rows, the manifest"),
    "a partition that is not a rank": (_bad_partition, "a folder where only"),
    "a file that is not Parquet": (_text_file, "a file where only"),
    "a named pipe": (_fifo, "not a regular file"),
    "a link out of the store": (_link_out, "a symbolic link"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_store_is_not_a_tracediag_store(store, tmp_path, case):
    edit, needle = CASES[case]
    s = tmp_path / "s"
    shutil.copytree(store, s, symlinks=True)
    named = edit(s)
    with pytest.raises(InputError) as e:
        open_store_views(s).close()
    assert e.value.path == str(named), str(e.value)
    assert e.value.problem.startswith("not a tracediag store: ") and needle in e.value.problem, str(e.value)
    assert "\n" not in str(e.value)


def test_the_store_as_ingested_is_read(store):
    con = open_store_views(store)
    try:
        assert con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0] > 0
    finally:
        con.close()


def test_a_table_of_more_than_1024_ranks_is_written_one_partition_each(tmp_path):
    """An nsys export with a device per kernel is thousands of ranks: pyarrow's default of 1,024 partitions made
    `tracediag ingest` an internal error (ArrowInvalid)."""
    from tracediag.store.parquet import write_arrow

    n = 1500
    assert write_arrow(tmp_path, "kernels", pa.table({"rank": pa.array(range(n), pa.int32()), "x": range(n)}), "p") == n
    assert len(list((tmp_path / "tables" / "kernels").iterdir())) == n
