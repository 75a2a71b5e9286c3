"""Derived tables built once after ingest: steps, gemm_shapes, collectives (+ step_collectives view) and the rest.

Each derivation is SQL in a `.sql` file beside this module, or a Python module's `build(con)` (Python only does
what SQL says badly: shape-list arithmetic on JSON dims, dtype spellings, interval unions). Each declares itself
where it is written, the way Perfetto's SQL stdlib modules do: a `.sql` file in its header comment

    -- requires: cpu_ops, steps, steps.T
    -- provides: sdpa_ops

with a `-- comment` beside every column it makes (tracediag.store reads them into the store's column comments);
a Python module in its constants `REQUIRES = (...)`, `PROVIDES = (...)`. What it reads (`requires`: tables, or a
stage of a table that another derivation fills, such as "steps.windows"), what it makes (`provides`: tables and
views left in the store; `updates`: the stages it fills in tables made by others), the temporary tables it leaves
for later derivations (`scratch`, dropped once all are built) and `late` (below). STEPS names the derivations;
REGISTRY holds their declarations. The build order is a topological sort of those declarations
(`build_order`), ties broken by the order of STEPS, so a derivation runs after everything it requires.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
from dataclasses import dataclass
from importlib import resources

import duckdb

from tracediag.interrupt import checkpoint
from tracediag.store import run_sql_file, transaction

# The parsers' tables (tracediag/store/schema*.sql) the derivations read: required without a provider.
CANONICAL = frozenset(("inputs", "process_groups", "kernels", "memops", "runtime", "cpu_ops", "annotations"))


@dataclass(frozen=True)
class Derivation:
    """One derived table (or a few built together).

    `step` is a `.sql` file beside this module (executed), or a module whose `build` is called with the
    connection. `late`: sorts a whole canonical table (every CPU op of a CPU-only trace),
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
            importlib.import_module(self.step).build(con)


# The derivations, in the order that breaks ties of the build order: a `.sql` file beside this module declares
# itself in its header, a Python module in its constants (read_declaration).
STEPS = (
    "tracediag.derive.attention",
    "tracediag.derive.step_markers",
    "steps.sql",
    "gemm_shapes.sql",
    "step_shapes.sql",
    "tracediag.derive.collectives",
    "tracediag.derive.kernel_phase",
    "tracediag.derive.windows",
    "tracediag.derive.fitness",
    "tracediag.derive.kernel_steps",
    "sdpa_ops.sql",
    "tracediag.derive.op_roofline",
    "eager_ops.sql",
)
FIELDS = ("requires", "provides", "updates", "scratch")  # a declaration's lists; `late` is a flag
_SQL_HEADER = re.compile(r"^--\s*(?P<key>requires|provides|updates|scratch|late):\s*(?P<value>.*?)\s*$")
_PY_CONSTANT = re.compile(r"^(?P<key>REQUIRES|PROVIDES|UPDATES|SCRATCH|LATE) = ", re.MULTILINE)


def sql_declaration(text: str) -> dict[str, tuple[str, ...] | bool]:
    """The declaration in a `.sql` derivation's header (the comment lines it starts with): `-- requires: a, b.c`,
    `-- provides: t`, `-- updates: t.stage`, `-- scratch: tmp`, and `-- late: why` for a late one."""
    out: dict[str, tuple[str, ...] | bool] = {}
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = _SQL_HEADER.match(line)
        if m and m.group("key") == "late":
            out["late"] = True
        elif m:
            out[m.group("key")] = tuple(n.strip() for n in m.group("value").split(",") if n.strip())
    return out


def python_declaration(text: str) -> dict[str, tuple[str, ...] | bool]:
    """The declaration of a Python derivation module, its module constants REQUIRES, PROVIDES, UPDATES, SCRATCH
    (tuples of names) and LATE, read from its source without importing it (a build imports the module; reading
    the registry does not, so `analyze --store` imports none of them)."""
    out: dict[str, tuple[str, ...] | bool] = {}
    for m in _PY_CONSTANT.finditer(text):
        rest = text[m.end() :].splitlines()
        for n in range(1, len(rest) + 1):  # the value ends on the first line where it parses
            try:
                out[m.group("key").lower()] = ast.literal_eval("\n".join(rest[:n]))
                break
            except SyntaxError:
                continue
    return out


def read_declaration(step: str) -> Derivation:
    """The Derivation a `.sql` file beside this module (its header) or a module (its constants) declares."""
    if step.endswith(".sql"):
        fields = sql_declaration(resources.files(__name__).joinpath(step).read_text(encoding="utf-8"))
    else:
        path = resources.files(__name__).joinpath(step.rpartition(".")[2] + ".py")
        fields = python_declaration(path.read_text(encoding="utf-8"))
    if "requires" not in fields or not set(fields) & {"provides", "updates"}:
        raise ValueError(f"{step} declares no requires, or neither provides nor updates")
    return Derivation(step, **fields)  # type: ignore[arg-type]


REGISTRY: tuple[Derivation, ...] = tuple(read_declaration(step) for step in STEPS)


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
                checkpoint()
                d.run(con)
        con.execute("".join(f"DROP TABLE IF EXISTS {name};" for d in order for name in d.scratch))
    for d in order:
        if d.late:
            checkpoint()
            with transaction(con):
                d.run(con)
