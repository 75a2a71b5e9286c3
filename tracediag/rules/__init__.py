"""Built-in rules, one module each, named by rule id and slug, in a sub-package per walk step (step1_shapes ...
step6_scheduling; docs/rules.md lists them, docs/adding-a-rule.md says how to add one).

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
    "tracediag.rules.step1_shapes.shp001_tp_divisibility",
    "tracediag.rules.step1_shapes.shp002_config_trace_consistency",
    "tracediag.rules.step1_shapes.shp003_quantization_applied",
    "tracediag.rules.step1_shapes.shp004_fits_on_one_card",
    "tracediag.rules.step2_path.path001_link_class",
    "tracediag.rules.step2_path.path002_bus_bandwidth",
    "tracediag.rules.step3_collectives.col001_collective_count",
    "tracediag.rules.step3_collectives.col002_payload_per_call",
    "tracediag.rules.step3_collectives.col003_alpha_beta_breakeven",
    "tracediag.rules.step4_application.col004_exposed_communication",
    "tracediag.rules.step4_application.col005_rank_skew",
    "tracediag.rules.step5_kernels.krn001_attention_dispatch",
    "tracediag.rules.step5_kernels.krn002_attention_share",
    "tracediag.rules.step5_kernels.krn003_w4a16_dispatch",
    "tracediag.rules.step5_kernels.krn004_w4_read_bound",
    "tracediag.rules.step5_kernels.krn005_decode_roofline",
    "tracediag.rules.step5_kernels.krn006_host_bound_decode",
    "tracediag.rules.step5_kernels.krn007_narrow_shards",
    "tracediag.rules.step5_kernels.krn008_unfused_elementwise",
    "tracediag.rules.step5_kernels.krn009_gemm_precision",
    "tracediag.rules.step5_kernels.krn010_cold_window",
    "tracediag.rules.step5_kernels.krn011_dominant_copies",
    "tracediag.rules.step6_scheduling.sch001_phase_split",
    "tracediag.rules.step6_scheduling.sch002_chunked_prefill_stalls",
    "tracediag.rules.step6_scheduling.sch003_queue_growth",
    "tracediag.rules.step6_scheduling.sch004_kv_pressure",
    "tracediag.rules.step6_scheduling.sch005_kv_capacity",
    "tracediag.rules.step6_scheduling.sch006_prefix_cache",
    "tracediag.rules.step6_scheduling.sch007_speculative_decoding",
    "tracediag.rules.step6_scheduling.sch008_littles_law",
    "tracediag.rules.step6_scheduling.sch009_load_test_validity",
    "tracediag.rules.step6_scheduling.sch010_slo_goodput",
    "tracediag.rules.step6_scheduling.sch011_engine_stall",
    "tracediag.rules.step6_scheduling.sch012_ttft_decomposition",
    "tracediag.rules.step6_scheduling.sch013_engine_imbalance",
)


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
