"""Generate docs/rules.md from the rule modules, so the reference cannot drift from the code.

python -m tracediag.docs > docs/rules.md
"""

from __future__ import annotations

import dataclasses
import inspect

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
        "Generated from the rule modules by `python -m tracediag.docs > docs/rules.md`; a test fails when it is",
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


if __name__ == "__main__":
    print(rules_markdown(), end="")
