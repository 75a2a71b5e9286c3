"""Derived tables built once after ingest: steps, gemm_shapes, collectives (+ step_collectives view) and the rest.

Each derivation is SQL in a `.sql` file beside this module, or a Python module's build function (Python only does
what SQL says badly: shape-list arithmetic on JSON dims, dtype spellings, interval unions). Every derivation is
declared in REGISTRY with what it reads (`requires`: tables, or a stage of a table that another derivation fills,
such as "steps.windows"), what it makes (`provides`: tables and views left in the store; `updates`: the stages
it fills in tables made by others) and the temporary tables it leaves for later derivations (`scratch`, dropped
once all are built). The build order is a topological sort of those declarations (`build_order`), ties broken by
the order of REGISTRY, so a derivation runs after everything it requires.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass

import duckdb

from tracediag.store import run_sql_file, transaction

# The parsers' tables (tracediag/store/schema*.sql) the derivations read: required without a provider.
CANONICAL = frozenset(("inputs", "process_groups", "kernels", "memops", "runtime", "cpu_ops", "annotations"))


@dataclass(frozen=True)
class Derivation:
    """One derived table (or a few built together).

    `step` is a `.sql` file beside this module (executed), or `module` / `module:function` (the function, default
    `build`, called with the connection). `late`: sorts a whole canonical table (every CPU op of a CPU-only trace),
    so it runs in a transaction of its own after the others are committed: a file store has written the derived
    tables out by then, and the sort does not share the memory budget with them (a 4 GB rank: 1.66 GiB peak
    inside the one transaction)."""

    step: str
    requires: tuple[str, ...]
    provides: tuple[str, ...] = ()
    updates: tuple[str, ...] = ()
    scratch: tuple[str, ...] = ()
    late: bool = False

    def run(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.step.endswith(".sql"):
            run_sql_file(con, "tracediag.derive", self.step)
        else:
            module, _, fn = self.step.partition(":")
            getattr(importlib.import_module(module), fn or "build")(con)


_OPS = ("kernels", "cpu_ops", "runtime")
_CLASSES = ("kernels.klass", "cpu_ops.klass")  # the classes attention.py decides from the launching op
# collective_calls.sql's temporary tables, read by collectives.py
_COLL_SCRATCH = ("coll_cand", "coll_outer", "coll_kern", "coll_calls", "coll_meta", "coll_gpu", "coll_dispatch")
_COLL_SCRATCH += ("coll_detached", "coll_pair")

REGISTRY: tuple[Derivation, ...] = (
    Derivation("tracediag.derive.attention", _OPS, provides=("kernel_op_class",), updates=_CLASSES),
    Derivation(
        "tracediag.derive.step_markers",
        ("annotations", "cpu_ops"),
        provides=("step_annotations_unparsed",),
        scratch=("step_markers",),
    ),
    Derivation("steps.sql", (*_OPS, *_CLASSES, "memops", "inputs", "step_markers"), provides=("steps",)),
    Derivation("gemm_shapes.sql", (*_OPS, *_CLASSES, "steps"), provides=("gemm_shapes",)),
    Derivation("step_shapes.sql", ("cpu_ops", "steps", "gemm_shapes"), updates=("steps.T",)),
    Derivation(
        "tracediag.derive.collectives:build_collectives",
        (*_OPS, *_CLASSES, "annotations", "steps", "steps.T"),
        provides=("collectives", "step_collectives"),
        scratch=_COLL_SCRATCH,
    ),
    Derivation(
        "tracediag.derive.kernel_phase",
        ("kernels", "runtime", "cpu_ops", "annotations", "kernels.klass", "steps", "steps.T"),
        provides=("step_kernel_phase",),
        updates=("steps.phase",),
    ),
    Derivation(
        "tracediag.derive.windows",
        (*_OPS, "memops", "inputs", "steps"),
        provides=("host_stalls", "gpu_timeline"),
        updates=("steps.windows",),
    ),
    Derivation(
        "tracediag.derive.fitness",
        # the domain (derive/domain.py, built here) reads the kernel classes, decode steps and GEMM shapes
        (*_OPS, *_CLASSES, "memops", "annotations", "inputs", "gpu_timeline", "steps.phase", "gemm_shapes"),
        provides=("window_fitness",),
    ),
    Derivation(
        "tracediag.derive.kernel_steps",
        (*_OPS, *_CLASSES, "memops", "steps", "steps.T", "steps.phase", "steps.windows"),
        provides=("kernel_steps", "step_activity"),
    ),
    Derivation("sdpa_ops.sql", ("cpu_ops", "steps", "steps.T"), provides=("sdpa_ops",)),
    Derivation(
        "tracediag.derive.op_roofline",
        ("kernels", "runtime", "cpu_ops", "inputs", "steps", "steps.phase"),
        provides=("op_roofline",),
    ),
    Derivation("eager_ops.sql", ("cpu_ops", "kernels", "steps", "steps.T"), provides=("eager_cpu_ops",), late=True),
)


def build_order(registry: tuple[Derivation, ...] = REGISTRY) -> list[Derivation]:
    """The derivations in an order where each runs after the providers of what it requires (Kahn's sort, ties in
    registry order; any other valid order builds the same tables: tests/test_derive_registry.py). A ValueError
    names a requirement nothing provides, a name two derivations provide, or a circle. A late derivation runs
    after every other one, so only late ones may require it."""
    providers: dict[str, int] = {}
    for i, d in enumerate(registry):
        for name in d.provides + d.updates + d.scratch:
            if name in providers or name in CANONICAL:
                raise ValueError(f"{name} is provided twice ({registry[providers.get(name, i)].step}, {d.step})")
            providers[name] = i
    deps: list[set[int]] = []
    for d in registry:
        missing = [r for r in d.requires if r not in providers and r not in CANONICAL]
        if missing:
            raise ValueError(f"{d.step} requires {', '.join(missing)}, which no derivation provides")
        deps.append({providers[r] for r in d.requires if r in providers})
    for i, d in enumerate(registry):
        if not d.late and any(registry[j].late for j in deps[i]):
            raise ValueError(f"{d.step} requires a late derivation's table; only a late derivation may")
    done: list[int] = []
    while len(done) < len(registry):
        ready = [i for i in range(len(registry)) if i not in done and deps[i] <= set(done)]
        ready = [i for i in ready if not registry[i].late] or ready  # the late ones last
        if not ready:
            left = [registry[i].step for i in range(len(registry)) if i not in done]
            raise ValueError(f"the derivations {', '.join(left)} require each other in a circle")
        done.append(ready[0])
    return [registry[i] for i in done]


def registry_version(registry: tuple[Derivation, ...] = REGISTRY) -> str:
    """Fingerprint of the declarations (a store records it: tracediag.fleet)."""
    return hashlib.sha256(repr(registry).encode()).hexdigest()[:12]


def provided_tables(registry: tuple[Derivation, ...] = REGISTRY) -> list[str]:
    """Every table and view the derivations leave in the store, in build order."""
    return [name for d in build_order(registry) for name in d.provides]


def build_all(con: duckdb.DuckDBPyConnection, order: list[Derivation] | None = None) -> None:
    """Build every derived table in `order` (default build_order()): one transaction (one commit of a file store)
    for all but the late derivations, which get one each; the scratch tables are dropped before the commit."""
    order = build_order() if order is None else order
    with transaction(con):
        for d in order:
            if not d.late:
                d.run(con)
        con.execute("".join(f"DROP TABLE IF EXISTS {name};" for d in order for name in d.scratch))
    for d in order:
        if d.late:
            with transaction(con):
                d.run(con)
