"""Built-in rules, one module each, named by RULEBOOK id and slug.

Registration is explicit: RULE_MODULES is the list the engine runs, in walk order. Third-party rules
register modules in the `tracediag.rules` entry-point group and go through the same path.
"""

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
