"""The derivation registry (tracediag/derive/__init__.py): each derivation's declaration is where it is written —
a `.sql` file's header names exactly the tables its SQL reads, and a comment beside every column it makes; a
Python module's constants, read from its source, are the ones it holds — its build order is valid, a requirement
left out of a declaration is caught, and every table it says it provides is in the store after a build."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from importlib import resources

import pytest
from conftest import EXTERNAL

import tracediag.derive
from tracediag.derive import (
    CANONICAL,
    FIELDS,
    REGISTRY,
    STEPS,
    Derivation,
    build_all,
    build_order,
    provided_tables,
    python_declaration,
    sql_declaration,
)
from tracediag.ingest import load, parse_all
from tracediag.store import open_store, schema_files, sql_column_comments

TRACE = EXTERNAL / "kineto" / "hta_gp100_gpu_user_annotation.json.gz"  # GPU kernels in an annotated step


def _valid(order: list[Derivation]) -> bool:
    made = set(CANONICAL)
    for d in order:
        if not set(d.requires) <= made:
            return False
        made |= set(d.provides + d.updates + d.scratch)
    return True


def test_the_build_order_is_a_valid_order_of_the_declarations():
    order = build_order()
    assert sorted(d.step for d in order) == sorted(d.step for d in REGISTRY)
    assert _valid(order)
    assert not _valid(list(reversed(order)))  # the check can fail
    late = [d.late for d in order]
    assert late == sorted(late), "the late derivations (own transaction) come last"


def test_a_requirement_nothing_provides_or_a_circle_is_an_error():
    more = tuple(
        dataclasses.replace(d, requires=(*d.requires, "no_such_table")) if d.step == "steps.sql" else d
        for d in REGISTRY
    )
    with pytest.raises(ValueError, match=r"steps\.sql requires no_such_table"):
        build_order(more)
    a = Derivation("a.sql", ("b",), provides=("a",))
    b = Derivation("b.sql", ("a",), provides=("b",))
    with pytest.raises(ValueError, match="circle"):
        build_order((a, b))
    with pytest.raises(ValueError, match="provided twice"):
        build_order((a, dataclasses.replace(b, provides=("a",))))


def test_canonical_requirements_are_tables_of_the_schema():
    ddl = " ".join(resources.files("tracediag.store").joinpath(f).read_text() for f in schema_files())
    assert all(re.search(rf"CREATE TABLE {t}\b", ddl) for t in CANONICAL)


def _code(sql: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", sql))  # comments and string literals aside


_MADE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?(?:TABLE|VIEW|MACRO)\s+(\w+)", re.I)
_CTE = re.compile(r"\b(\w+)\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(", re.I)
_READ = re.compile(r"\b(?:FROM|JOIN|UPDATE)\s+(\w+)\b(?!\s*\()", re.I)  # a name, not a table function's call


def tables_read(sql: str) -> set[str]:
    """The tables a SQL text reads or updates (after FROM, JOIN, UPDATE), less those it makes and its CTEs."""
    code = _code(sql)
    made = {n.lower() for n in _MADE.findall(code) + _CTE.findall(code)}
    return {n.lower() for n in _READ.findall(code)} - made


def _sql(step: str) -> str:
    return resources.files("tracediag.derive").joinpath(step).read_text(encoding="utf-8")


def test_tables_read_finds_from_join_and_update_but_not_ctes_or_what_the_file_makes():
    sql = """-- FROM not_me
    CREATE TEMP TABLE t AS WITH c AS (SELECT * FROM a WHERE x = 'FROM b') SELECT * FROM c JOIN d USING (k);
    UPDATE e SET y = 1 FROM (SELECT * FROM t) s; SELECT * FROM read_parquet('f');"""
    assert tables_read(sql) == {"a", "d", "e"}


@pytest.mark.parametrize("step", [s for s in STEPS if s.endswith(".sql")])
def test_a_sql_derivation_declares_in_its_header_the_tables_it_reads(step):
    """`-- requires:` names (stages aside) exactly the tables the SQL reads, so the header cannot drift from it."""
    declared = sql_declaration(_sql(step))
    assert {r.split(".")[0] for r in declared["requires"]} == tables_read(_sql(step)), step


@pytest.mark.parametrize("step", [s for s in STEPS if not s.endswith(".sql")])
def test_a_python_derivation_declares_in_its_constants_what_the_registry_reads(step):
    """The registry reads a module's REQUIRES / PROVIDES / UPDATES / SCRATCH / LATE from its source (importing
    none): what it reads is what the module holds, in the one form every Python derivation uses."""
    module = importlib.import_module(step)
    text = inspect.getsource(module)
    assert python_declaration(text) == {
        f: getattr(module, f.upper()) for f in (*FIELDS, "late") if hasattr(module, f.upper())
    }
    assert callable(module.build) and "requires" in python_declaration(text)


def test_the_registry_is_the_declarations_of_the_steps():
    assert tuple(d.step for d in REGISTRY) == STEPS
    with pytest.raises(ValueError, match="declares no requires"):
        tracediag.derive.read_declaration("collective_calls.sql")  # a part of collectives.py, not a derivation
    assert sql_declaration("-- requires: a, b.c\n-- late: why\nSELECT 1; -- provides: no") == {
        "requires": ("a", "b.c"),
        "late": True,
    }


@functools.cache
def _parsed():
    return parse_all([(TRACE, None)])


def _fingerprint(order: list[Derivation]) -> dict[str, tuple]:
    con = open_store()
    try:
        load(con, _parsed())
        build_all(con, order)
        return {
            t: con.execute(f"SELECT count(*), sum(hash(x))::HUGEINT FROM {t} x").fetchone() for t in provided_tables()
        }
    finally:
        con.close()


@functools.cache
def _reference() -> dict[str, tuple]:
    return _fingerprint(build_order())


def _earliest(step: str, registry: tuple[Derivation, ...] = REGISTRY) -> list[Derivation]:
    """A valid order of `registry` that runs `step` as soon as its declared requirements allow."""
    providers = {n: d for d in registry for n in d.provides + d.updates + d.scratch}
    need: set[str] = set()
    todo = [next(d for d in registry if d.step == step)]
    while todo:
        d = todo.pop()
        if d.step not in need:
            need.add(d.step)
            todo += [providers[r] for r in d.requires if r in providers]
    order = build_order(registry)
    return [d for d in order if d.step in need] + [d for d in order if d.step not in need]


def test_every_provided_table_is_in_the_store_after_a_build():
    ref = _reference()
    assert set(ref) == set(provided_tables())
    assert ref["steps"][0] and ref["kernel_steps"][0] and ref["step_activity"][0], "the sample must exercise them"


def test_a_sql_derivation_comments_every_column_it_makes_in_its_own_file():
    con = open_store()
    try:
        load(con, _parsed())
        build_all(con)
        for d in REGISTRY:
            if not d.step.endswith(".sql"):
                continue
            said = sql_column_comments(_sql(d.step))
            for table in d.provides:
                cols = [
                    r[0]
                    for r in con.execute(
                        "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [table]
                    ).fetchall()
                ]
                assert cols and not [c for c in cols if c not in said.get(table, {})], (d.step, table)
    finally:
        con.close()


@pytest.mark.parametrize("step", [d.step for d in REGISTRY if set(d.requires) - CANONICAL])
def test_running_a_derivation_as_early_as_declared_builds_the_same_tables(step):
    """A requirement missing from a declaration lets the derivation run before what it reads is built: its
    table would then differ (or the build fail)."""
    assert _fingerprint(_earliest(step)) == _reference()


def test_a_requirement_left_out_is_caught():
    """kernel_steps declared without the steps' GPU windows (windows.py) runs before them: step_activity differs."""
    cut = tuple(
        dataclasses.replace(d, requires=tuple(r for r in d.requires if r not in ("steps.windows", "steps.T")))
        if d.step == "tracediag.derive.kernel_steps"
        else d
        for d in REGISTRY
    )
    order = _earliest("tracediag.derive.kernel_steps", cut)
    assert _valid(order)  # valid for the cut declarations...
    assert _fingerprint(order)["step_activity"] != _reference()["step_activity"]  # ...but not what it reads
