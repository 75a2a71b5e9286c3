"""Built-in rules, one module each, named by rule id and slug (docs/rules.md lists them, docs/adding-a-rule.md
says how to add one).

Registration is explicit: RULE_MODULES is the list the engine runs, in walk order. Third-party rules
register modules in the `tracediag.rules` entry-point group and go through the same path. A rule never
imports another rule: what several share is in tracediag.analyses, and a rule that reads another's verdict
asks `upstream_check` for it by id.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.context import Context
    from tracediag.findings import Check

RULE_MODULES = (
    "tracediag.rules.shp001_tp_divisibility",
    "tracediag.rules.shp002_config_trace_consistency",
    "tracediag.rules.shp003_quantization_applied",
    "tracediag.rules.shp004_fits_on_one_card",
    "tracediag.rules.path001_link_class",
    "tracediag.rules.path002_bus_bandwidth",
    "tracediag.rules.col001_collective_count",
    "tracediag.rules.col002_payload_per_call",
    "tracediag.rules.col003_alpha_beta_breakeven",
    "tracediag.rules.col004_exposed_communication",
    "tracediag.rules.col005_rank_skew",
    "tracediag.rules.krn001_attention_dispatch",
    "tracediag.rules.krn002_attention_share",
    "tracediag.rules.krn003_w4a16_dispatch",
    "tracediag.rules.krn004_w4_read_bound",
    "tracediag.rules.krn005_decode_roofline",
    "tracediag.rules.krn006_host_bound_decode",
    "tracediag.rules.krn007_narrow_shards",
    "tracediag.rules.krn008_unfused_elementwise",
    "tracediag.rules.krn009_gemm_precision",
    "tracediag.rules.krn010_cold_window",
    "tracediag.rules.krn011_dominant_copies",
    "tracediag.rules.sch001_phase_split",
    "tracediag.rules.sch002_chunked_prefill_stalls",
    "tracediag.rules.sch003_queue_growth",
    "tracediag.rules.sch004_kv_pressure",
    "tracediag.rules.sch005_kv_capacity",
    "tracediag.rules.sch006_prefix_cache",
    "tracediag.rules.sch007_speculative_decoding",
    "tracediag.rules.sch008_littles_law",
    "tracediag.rules.sch009_load_test_validity",
    "tracediag.rules.sch010_slo_goodput",
    "tracediag.rules.sch011_engine_stall",
    "tracediag.rules.sch012_ttft_decomposition",
    "tracediag.rules.sch013_engine_imbalance",
)


def upstream_check(ctx: Context, rule_id: str) -> Check:
    """The check of the built-in rule `rule_id` on `ctx`, its module found in RULE_MODULES by id: how a rule reads
    an upstream rule's verdict (COL003 reads COL001's and COL002's on the cost model). Those rules keep their
    check once per memoized stretch, so the engine's run and this one share it."""
    prefix = rule_id.lower() + "_"
    (name,) = [m for m in RULE_MODULES if m.rpartition(".")[2].startswith(prefix)]
    return importlib.import_module(name).check(ctx)
