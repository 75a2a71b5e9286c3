"""Built-in rules, one module each, named by rule id and slug, in a sub-package per walk step (step1_shapes ...
step6_scheduling; docs/rules.md lists them, docs/adding-a-rule.md says how to add one).

Registration is the file: RULE_MODULES, the list the engine runs, is every `<id>_<slug>.py` of the walk-step
packages (`step<N>_<name>`), ordered by (step, id), so adding a rule's module is the only edit that registers
it. Third-party rules register modules in the `tracediag.rules` entry-point group and go through the same path.
A rule never imports another rule: what several share is in tracediag.analyses, and a rule that reads another's
verdict asks `upstream_check` for it by id.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.context import Context
    from tracediag.findings import Check

_STEP_PACKAGE = re.compile(r"step(\d+)_[a-z0-9_]+")
_RULE_MODULE = re.compile(r"([a-z]+\d+)_[a-z0-9_]+")  # krn002_attention_share -> krn002


def discover() -> tuple[str, ...]:
    """The built-in rule modules found in the walk-step packages, by (step, rule id); nothing is imported but the
    packages themselves."""
    found = []
    for pkg in pkgutil.iter_modules(__path__):
        step = _STEP_PACKAGE.fullmatch(pkg.name)
        if not (pkg.ispkg and step):
            continue
        package = importlib.import_module(f"{__name__}.{pkg.name}")
        for mod in pkgutil.iter_modules(package.__path__):
            rule = _RULE_MODULE.fullmatch(mod.name)
            if rule and not mod.ispkg:
                found.append(((int(step.group(1)), rule.group(1).upper()), f"{package.__name__}.{mod.name}"))
    return tuple(name for _, name in sorted(found))


RULE_MODULES = discover()


def module_name(rule_id: str) -> str:
    """The module of the built-in rule `rule_id`: "KRN005" -> "tracediag.rules.step5_kernels.krn005_decode_roofline"."""
    prefix = rule_id.lower() + "_"
    (name,) = [m for m in RULE_MODULES if m.rpartition(".")[2].startswith(prefix)]
    return name


def upstream_check(ctx: Context, rule_id: str) -> Check:
    """The check of the built-in rule `rule_id` on `ctx`, its module found in RULE_MODULES by id: how a rule reads
    an upstream rule's verdict (COL003 reads COL001's and COL002's on the cost model). Those rules keep their
    check once per memoized stretch, so the engine's run and this one share it."""
    return importlib.import_module(module_name(rule_id)).check(ctx)
