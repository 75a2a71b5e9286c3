"""The derivation registry (tracediag/derive/__init__.py): its build order is valid, a requirement left out of a
declaration is caught, and every table it says it provides is in the store after a build."""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources

import pytest
from conftest import EXTERNAL

from tracediag.derive import CANONICAL, REGISTRY, Derivation, build_all, build_order, provided_tables
from tracediag.ingest import load, parse_all
from tracediag.store import open_store, schema_files

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
    return re.sub(r"--[^\n]*", "", sql)


def test_each_sql_derivation_requires_the_derived_tables_it_reads():
    """A derived table named in a .sql derivation's SQL (comments aside) is one it provides or requires."""
    derived = {n: d for d in REGISTRY for n in d.provides + d.scratch}
    for d in REGISTRY:
        if not d.step.endswith(".sql"):
            continue
        words = set(re.findall(r"\b[a-z_]+\b", _code(resources.files("tracediag.derive").joinpath(d.step).read_text())))
        read = {n for n in words & set(derived) if derived[n] is not d}
        assert read <= set(d.requires), (d.step, read - set(d.requires))


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
