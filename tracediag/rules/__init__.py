"""Built-in rules, one module each, named by RULEBOOK id and slug.

Registration is explicit: RULE_MODULES is the list the engine runs, in walk order. Third-party rules
register modules in the `tracediag.rules` entry-point group and go through the same path.
"""

RULE_MODULES = (
    "tracediag.rules.shp001_tp_divisibility",
    "tracediag.rules.shp002_config_trace_consistency",
    "tracediag.rules.col001_collective_count",
    "tracediag.rules.col002_payload_per_call",
)
