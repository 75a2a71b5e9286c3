"""The package's floors: every import (at module level, inside a function, or for type checking only) goes from a
floor to the same floor or one below, and no modules import each other in a circle. README's "Layout" lists the
floors; a rule never imports another rule (it reads tracediag.analyses, or another rule's verdict through
tracediag.rules.upstream_check)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "tracediag"

# Top to bottom. A module belongs to the floor of its longest listed prefix.
FLOORS = [
    (
        "entry points",
        ["tracediag", "tracediag.__main__", "tracediag.cli", "tracediag.docs", "tracediag.testing", "tracediag.agent"],
    ),
    (
        "library",
        [
            "tracediag.analysis",
            "tracediag.gate",
            "tracediag.diff",
            "tracediag.notebook",
            "tracediag.runs",
            "tracediag.request",
            "tracediag.output",
            "tracediag.fleet",
            "tracediag.engine",
            "tracediag.live",
        ],
    ),
    ("rules and reports", ["tracediag.rules", "tracediag.reports", "tracediag.measures"]),
    ("analyses", ["tracediag.analyses"]),
    ("context", ["tracediag.context"]),
    ("pipeline", ["tracediag.pipeline"]),
    ("derive", ["tracediag.derive"]),
    ("ingest", ["tracediag.ingest"]),
    ("store", ["tracediag.store"]),
    (
        "model, catalog and the leaves",
        [
            "tracediag.model",
            "tracediag.catalog",
            "tracediag.errors",
            "tracediag.findings",
            "tracediag.memory",
            "tracediag.version",
            "tracediag.files",
            "tracediag.inputfile",
            "tracediag.inputspec",
            "tracediag.interrupt",
            "tracediag.schemas",
        ],
    ),
]

# Imports that still run upward, each with what removes it. An entry that no longer occurs fails the test, so the
# list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(REPO).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _imports() -> dict[str, dict[str, int]]:
    """module -> {imported tracediag module: line}; `from P import name` counts as P.name when that is a module."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for m, (f, is_pkg) in mods.items():
        here = m if is_pkg else m.rpartition(".")[0]
        out = edges.setdefault(m, {})
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                r = resolve(t) if t.startswith("tracediag") else None
                if r and r != m:
                    out.setdefault(r, node.lineno)
    return edges


def _floor(module: str) -> int:
    best = max(
        (
            (i, len(p))
            for i, (_, prefixes) in enumerate(FLOORS)
            for p in prefixes
            if module == p or module.startswith(p + ".")
        ),
        key=lambda x: x[1],
        default=None,
    )
    assert best is not None, f"{module} is on no floor: add it to FLOORS (and README's Layout)"
    return best[0]


def test_every_import_goes_down_or_stays_on_its_floor():
    edges = _imports()
    upward = {(a, b): line for a, bs in edges.items() for b, line in bs.items() if _floor(b) < _floor(a)}
    new = [
        f"{a}:{line} ({FLOORS[_floor(a)][0]}) imports {b} ({FLOORS[_floor(b)][0]})"
        for (a, b), line in sorted(upward.items())
        if (a, b) not in KNOWN_UPWARD
    ]
    assert not new, "imports running up the floors (move the shared thing down instead):\n" + "\n".join(new)
    gone = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not gone, f"no longer imported upward, remove from KNOWN_UPWARD: {gone}"


def test_no_import_circles():
    edges = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    known = {frozenset(k) for k in KNOWN_UPWARD}
    circles = [c for c in circles if not any(k <= set(c) for k in known)]
    assert not circles, f"modules importing each other in a circle: {circles}"


def test_no_rule_imports_another_rule():
    edges = _imports()
    rule = [m for m in edges if m.startswith("tracediag.rules.")]
    assert len(rule) >= 32
    bad = [f"{a} imports {b}" for a in rule for b in edges[a] if b.startswith("tracediag.rules.")]
    assert not bad, bad
    outside = [
        f"{a} imports {b}"
        for a, bs in edges.items()
        if not a.startswith("tracediag.rules")
        for b in bs
        if b.startswith("tracediag.rules.")
    ]
    assert not outside, f"only the registry (tracediag.rules) is imported from outside the rules: {outside}"
