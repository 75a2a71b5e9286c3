"""docs/adding-a-rule.md followed mechanically: in a copy of the package, a new rule is one module file (the
docstring's four sections, RULE, check) plus its cases file, and with no other edit it is registered, runs in
the report, counts in the coverage and is run by the rule-cases machinery (tests/test_rule_cases.py); every
listing of the rules follows from the module — the generated docs/rules.md, README.md's rule table and the rules
of its step in docs/method.md gain it (`python -m tracediag.docs --write`), and nothing else in them changes.
Also: the registered list is what the walk-step packages hold, in (step, id) order."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

from tracediag.rules import RULE_MODULES

# docs/adding-a-rule.md, section 2: the module. A scratch id far from the next free KRN number, so that a rule
# added later never collides with it.
SCRATCH_RULE = '''\
"""KRN990 CPU ops per layer stay under a budget.

Hypothesis: a model whose layers each run many framework ops spends its step on the host, not on the GPU.

Formula: ops per layer = n_ops / L (CPU ops over the trace, L layers of the model config); a finding at
or above BUDGET.

Evidence: the op count, L, the ratio and the budget; the longest ops.

What to do: fuse the layer's small ops (torch.compile, CUDA graphs) and count again.
"""

from __future__ import annotations

from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, passed

RULE = RuleMeta(
    id="KRN990",
    step=5,
    title="CPU ops per layer stay under a budget",
    requires_tables=("cpu_ops",),
    requires_model=("L",),
)
BUDGET = 400.0  # ops per layer, L = 4: between HTA's GP100 trace (~160) and its rank-not-found one (~600)


def check(ctx: Context) -> Check:
    n = ctx.scalar("SELECT count(*) FROM cpu_ops")
    L = ctx.model.L
    ratio = n / L
    evidence = ctx.rows(
        "SELECT rank, name, ts_ns, dur_ns FROM cpu_ops ORDER BY dur_ns DESC, ts_ns LIMIT ?", [ctx.settings.max_evidence]
    )
    common = {
        "formula": "ops per layer = n_ops / L",
        "substituted": f"{n} / {L} = {ratio:.0f}",
        "values": {"ops": n, "L": L, "ops_per_layer": ratio, "budget": BUDGET},
        "evidence": evidence,
    }
    if ratio >= BUDGET:
        return finding(RULE, severity="info", confidence="low", title=f"{ratio:.0f} CPU ops per layer",
                       next_check="Fuse the layer's small ops and count again.", **common)  # fmt: skip
    return passed(RULE, confidence="low", title=f"{ratio:.0f} CPU ops per layer, under {BUDGET:.0f}", **common)
'''

# section 4: its cases, one of each status, on real inputs
SCRATCH_CASES = """\
[[case]]
name = "HTA's GP100 trace with a 4-layer config: ~160 ops per layer"
trace = "tests/data/external/kineto/hta_gp100_gpu_user_annotation.json.gz"
model = "sample_traces/healthy_tp1/config.json"
status = "pass"

[[case]]
name = "HTA's rank-not-found trace with a 4-layer config: ~600 ops per layer"
trace = "tests/data/external/kineto/hta_rank_not_found.json.gz"
model = "sample_traces/healthy_tp1/config.json"
status = "finding"
severity = "info"
values = { L = 4, ops = 2424 }

[[case]]
name = "no model config"
trace = "tests/data/external/kineto/hta_large_integer.pt.trace.json.gz"
status = "not_applicable"
reason_contains = "missing model config (L); pass --model config.json"
"""

# Run in the copy: the registry, the rule-cases machinery, the report, the coverage and the docs.
CHECKS = """\
import sys

sys.path.insert(0, "tests")
import test_rule_cases as cases

from tracediag.docs import rules_markdown
from tracediag.rules import RULE_MODULES

name = "tracediag.rules.step5_kernels.krn990_ops_per_layer"
i = RULE_MODULES.index(name)
assert RULE_MODULES[i - 1].endswith(".krn012_buyable_kernel_time") and ".step6_" in RULE_MODULES[i + 1], RULE_MODULES
mine = [p.values for p in cases._cases() if p.values[0] == "KRN990"]
assert sorted(c["status"] for _, c in mine) == ["finding", "not_applicable", "pass"], mine
for rule, case in mine:
    if case["status"] != "pass":  # the finding runs its check() in a report; the pass case would add an analysis
        cases.test_case(rule, case)
cases.test_every_rule_has_pass_finding_and_na_cases()
na = next(c for _, c in mine if c["status"] == "not_applicable")
report = cases._report(na["trace"], None, None, "KRN990")  # the machinery's analysis of that case
cov = report.to_dict()["verdict"]["coverage"]
assert cov["rules"] == len(RULE_MODULES), cov
assert "KRN990" in next(g["rules"] for g in cov["enable"] if g["input"] == "--model config.json"), cov
doc = rules_markdown()
assert "### KRN990 — CPU ops per layer stay under a budget" in doc
assert "Module `tracediag.rules.step5_kernels.krn990_ops_per_layer`. Needs: tables `cpu_ops`; model `L`." in doc
assert "Enabled by: `--model config.json`." in doc
# the other listings: README.md's table and docs/method.md's step 5 gain the rule, and nothing else changes
import difflib
from pathlib import Path

from tracediag.docs import generated_files

changed = {}
for path, text in generated_files(Path(".")).items():
    if path.name != "rules.md":
        old = path.read_text(encoding="utf-8").splitlines()
        diff = [d for d in difflib.ndiff(old, text.splitlines()) if d[:2] in ("+ ", "- ")]
        changed[str(path)] = diff
link = "[KRN990](docs/rules.md#krn990--cpu-ops-per-layer-stay-under-a-budget)"
row = f"| {link} | 5 | CPU ops per layer stay under a budget |"
assert changed["README.md"] == ["+ " + row], changed["README.md"]
removed, added = changed["docs/method.md"]
assert removed.startswith("- *Rules of this step*") and removed.endswith(", KRN012."), removed
assert added == "+" + removed[1:-1] + ", KRN990.", added
print("rules:", len(RULE_MODULES))
"""


def _copy(src: Path, dst: Path) -> None:
    # compiled files come along (copy2 keeps the sources' times, so they stay valid): only the new module compiles
    shutil.copytree(src, dst, copy_function=shutil.copy2)


def test_a_new_rule_is_one_file_and_its_cases(tmp_path):
    _copy(REPO / "tracediag", tmp_path / "tracediag")
    (tmp_path / "tests").mkdir()
    for f in ("conftest.py", "browser.py", "test_rule_cases.py"):
        shutil.copy2(REPO / "tests" / f, tmp_path / "tests" / f)
    _copy(REPO / "tests" / "cases", tmp_path / "tests" / "cases")
    (tmp_path / "tests" / "data").symlink_to(REPO / "tests" / "data")
    (tmp_path / "sample_traces").symlink_to(REPO / "sample_traces")
    (tmp_path / "docs").mkdir()
    for f in ("README.md", "docs/method.md"):  # the pages with generated listings, as the repository has them
        shutil.copy2(REPO / f, tmp_path / f)
    # the only edits: the module and its cases
    (tmp_path / "tracediag/rules/step5_kernels/krn990_ops_per_layer.py").write_text(SCRATCH_RULE)
    (tmp_path / "tests/cases/krn990.toml").write_text(SCRATCH_CASES)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECKS)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == f"rules: {len(RULE_MODULES) + 1}"


def test_registered_rules_are_the_walk_step_packages_in_step_and_id_order():
    keys = []
    for name in RULE_MODULES:
        package, module = name.rsplit(".", 2)[1:]
        meta = importlib.import_module(name).RULE
        assert package.startswith(f"step{meta.step}_"), (name, meta.step)  # a rule sits in its step's package
        assert module.split("_", 1)[0] == meta.id.lower(), (name, meta.id)
        keys.append((meta.step, meta.id))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert len(RULE_MODULES) == len(list((REPO / "tracediag" / "rules").glob("step*_*/[a-z]*[0-9]_*.py")))
