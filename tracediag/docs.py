"""Generate every listing of the rules from the rule modules, so none can drift from the code: docs/rules.md
(the reference), README.md's "What it checks" table and the line under each step of docs/method.md naming that
step's rules (the blocks between `<!-- generated: NAME -->` and `<!-- end: NAME -->`).

python -m tracediag.docs --write     # from the repository root: rewrite docs/rules.md and the generated blocks
python -m tracediag.docs > docs/rules.md   # the reference alone
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

from tracediag.context import Settings
from tracediag.engine import load_rules
from tracediag.findings import WALK_STEPS

REQUIRED_SECTIONS = ("Hypothesis:", "Formula:", "Evidence:", "What to do:")
WINDOW_NEEDS = {  # RuleMeta.requires_window, in words (tracediag/derive/fitness.py)
    "complete": "a complete window (every event: not sampled, GPU events kept, not too short)",
    "steady": "a steady window (complete, with steady work after start-up)",
}


def rules_markdown() -> str:
    out = [
        "# Rules reference",
        "",
        "Generated from the rule modules by `python -m tracediag.docs --write`; a test fails when it is",
        "stale. Why the rules are what they are — walk order, formulas, assumptions, sources — is in",
        "[method.md](method.md). Every rule returns `pass`, `finding` or `not_applicable` (with the missing input",
        'named, or why the profiled window cannot be judged: method.md, "The window before the rules").',
        "A rule's *Enabled by* lists the inputs of `tracediag analyze` that can let it run (its",
        "`RuleMeta.enabled_by`): the coverage line offers the one a run lacked (`pass --topology topo.json to",
        "enable PATH001`).",
        "",
        "## Settings and their defaults",
        "",
        "| setting | default | meaning |",
        "|---|---|---|",
    ]
    src = inspect.getsource(Settings)
    for f in dataclasses.fields(Settings):
        comment = next(
            (
                line.split("#", 1)[1].strip()
                for line in src.splitlines()
                if line.strip().startswith(f"{f.name}:") and "#" in line
            ),
            "",
        )
        out.append(f"| `{f.name}` | `{f.default}` | {comment.replace('|', chr(92) + '|')} |")
    for step, name in WALK_STEPS.items():
        mods = [m for m in load_rules() if m.RULE.step == step]
        out += ["", f"## Step {step}: {name}", ""]
        if not mods:
            out.append("No rule implemented yet.")
        for mod in mods:
            meta = mod.RULE
            out += [f"### {meta.id} — {meta.title}", ""]
            needs = []
            if meta.requires_tables:
                needs.append("tables " + ", ".join(f"`{t}`" for t in meta.requires_tables))
            if meta.requires_model:
                needs.append("model " + ", ".join(f"`{f}`" for f in meta.requires_model))
            if meta.requires_tp:
                needs.append("the TP degree p")
            if meta.requires_window:
                needs.append(WINDOW_NEEDS[meta.requires_window])
            out.append(f"Module `{mod.__name__}`. Needs: {'; '.join(needs) or 'nothing'}.")
            if meta.enabled_by:
                out.append(f"Enabled by: {', '.join(f'`{e}`' for e in meta.enabled_by)}.")
            if meta.may_be_downstream_of:
                out.append(f"May be downstream of: {', '.join(meta.may_be_downstream_of)}.")
            out += ["", inspect.cleandoc(mod.__doc__ or "").split("\n", 2)[-1].strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, what is neither a word character, a hyphen nor a space
    dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def rules_table() -> str:
    """README.md's "What it checks": one row per registered rule, its id (linked to its docs/rules.md section),
    walk step and title."""
    rows = ["| id | step | checks |", "|---|---|---|"]
    for m in load_rules():
        meta = m.RULE
        link = f"[{meta.id}](docs/rules.md#{heading_anchor(f'{meta.id} — {meta.title}')})"
        rows.append(f"| {link} | {meta.step} | {meta.title.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def step_rules(step: int) -> str:
    """The line under a step of docs/method.md naming the step's rules."""
    ids = [m.RULE.id for m in load_rules() if m.RULE.step == step]
    listed = ", ".join(ids) if ids else "none yet"
    return f"*Rules of this step* ([rules.md](rules.md), generated from the rule modules): {listed}."


# Each generated block: the file it sits in and what fills it.
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {"rules-table": ("README.md", rules_table)}
BLOCKS |= {f"step-{n}-rules": ("docs/method.md", lambda n=n: step_rules(n)) for n in WALK_STEPS}
_BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.DOTALL)


def fill_blocks(text: str, path: str) -> str:
    """`text` (the file at `path`, relative to the repository root) with its generated blocks refreshed; a
    ValueError names a block of BLOCKS the file lacks."""
    want = {name for name, (where, _) in BLOCKS.items() if where == path}
    seen: set[str] = set()

    def refresh(m: re.Match) -> str:
        name = m.group("name")
        if name not in BLOCKS or BLOCKS[name][0] != path:
            raise ValueError(f"{path}: unknown generated block {name}")
        seen.add(name)
        return m.group(1) + BLOCKS[name][1]() + "\n" + m.group(4)

    out = _BLOCK.sub(refresh, text)
    if want - seen:
        raise ValueError(f"{path} lacks the generated block(s) {', '.join(sorted(want - seen))}")
    return out


def generated_files(root: Path) -> dict[Path, str]:
    """{path: its current content} of every file this module generates or fills, under the repository `root`."""
    out = {root / "docs" / "rules.md": rules_markdown()}
    for path in sorted({where for where, _ in BLOCKS.values()}):
        out[root / path] = fill_blocks((root / path).read_text(encoding="utf-8"), path)
    return out


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path, text in generated_files(Path.cwd()).items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(Path.cwd())}", file=sys.stderr)
        return 0
    if argv:
        print("usage: python -m tracediag.docs [--write]", file=sys.stderr)
        return 2
    print(rules_markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
