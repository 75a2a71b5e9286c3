"""SCH006 Prefix cache effectiveness.

Hypothesis: a prefix cache only saves the prefill of the tokens it actually reuses. "90 % of requests hit"
can mean 1.54 % of prompt tokens reused and 0.344 % of prefill work saved (many short hits, long misses;
with a = 1, b = 1/1024 in C(n)); a full hit still recomputes the last position. With the queue held fixed,
caching removes only the prefill share of TTFT; it can also lower queueing by lowering load, so whether
queueing falls must be measured, not assumed.

Formula: request hit rate = #(h > 0)/N; token reuse rate = Σh / Σn; modelled compute saved
= Σ C(h) / Σ C(n) with C(n) = a·n + b·n(n+1)/2 (the remaining work is C(n) − C(h), not C(n − h)); only
full blocks are reused (floor(h/B)·B). Finding (info) when prefix caching runs but reuses < 10 % of
prompt tokens.

Evidence: vLLM's token-level hit rate (stats-line "Prefix cache hit rate": hits / queried tokens over
the last 1,000 requests, vllm/v1/core/kv_cache_utils.py PrefixCachingMetrics; External prefix cache hit
rate for KV connectors) or the /metrics counters prefix_cache_hits / prefix_cache_queries (before
0.10: gpu_prefix_cache_*; SGLang: cached_tokens / prompt_tokens) over the run: their difference between the
scrapes taken before and after it ("between scrape 1 and 2 of FILE"), the lifetime only for one scrape ("since
server start"), never across a counter reset; enable_prefix_caching from the startup line; requests waiting at
the same time. Impact: none — token reuse is a share of prompt tokens, not of request time or of requests, so the
finding ranks by its severity. Per-request (n, h) pairs are not in vLLM's logs, metrics or benchmark results,
so the request hit rate and the compute saved are reported as not measurable rather than guessed.

What to do: if reuse is low, put stable content (system prompt, documents) first and per-request text
last, check the chat template; when requests queue (SCH003), measure TTFT with the cache off, cold and warm
before crediting or blaming it — the engine's hit rate may count block lookups, not the two rates above.
"""

from __future__ import annotations

from tracediag.analyses.serving import counter_windows, input_paths, log_evidence, series_label, startup_facts
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SCH006",
    step=6,
    title="Prefix cache reuses a useful share of prompt tokens",
    may_be_downstream_of=(),
    enabled_by=("--log", "--metrics"),
)
LOW_REUSE = 0.10
FORMULA = "token reuse = Σh / Σn (hits / queried tokens); compute saved = Σ C(h) / Σ C(n), C(n) = a·n + b·n(n+1)/2"


def _from_logs(ctx: Context) -> list[dict]:
    paths = input_paths(ctx)
    out = []
    for r in ctx.rows(
        # the last by time, or by line where no line of the series has a time (SGLang lines without a timestamp)
        "SELECT input_id, engine, count(*) AS n, avg(prefix_hit_pct) AS mean_pct, "
        "coalesce(arg_max(prefix_hit_pct, t_s), arg_max(prefix_hit_pct, line)) AS last_pct, "
        "max(external_prefix_hit_pct) AS external_pct, max(waiting) AS max_waiting, "
        "coalesce(arg_max(line, t_s), max(line)) AS line, coalesce(arg_max(ts_text, t_s), arg_max(ts_text, line)) "
        "AS ts_text, max(t_s) AS t_s FROM serving_stats WHERE prefix_hit_pct IS NOT NULL "
        "GROUP BY input_id, engine ORDER BY input_id, engine"
    ):
        out.append(
            {
                "source": "log stats lines",
                "series": series_label(paths.get(r["input_id"]), r["engine"]),
                "token_reuse": r["last_pct"] / 100,
                "token_reuse_mean": r["mean_pct"] / 100,
                "external_reuse": r["external_pct"] / 100 if r["external_pct"] is not None else None,
                "max_waiting": r["max_waiting"],
                "samples": r["n"],
                "evidence": log_evidence(paths.get(r["input_id"], "?"), r, "stats line (last)", value=r["last_pct"]),
            }
        )
    return out


def _from_metrics(ctx: Context) -> tuple[list[dict], list[str]]:
    """Token reuse per /metrics series over its window (counter_windows: the difference between scrapes, the
    lifetime for one scrape), and why a series gave none (no query in the window, a counter reset)."""
    out, skipped = [], []
    for w in counter_windows(ctx):
        if not (w.has("prefix_cache_queries") or w.has("cached_tokens")):
            continue
        if w.broken:
            skipped.append(f"{w.series}: {w.basis}")
            continue
        queries, hits = w.total("prefix_cache_queries"), w.total("prefix_cache_hits")
        names = "prefix_cache_hits / prefix_cache_queries"
        if (queries is None or hits is None) and w.total("cached_tokens") is not None:
            queries, hits = w.total("prompt_tokens"), w.total("cached_tokens")  # SGLang: cached / prompt tokens
            names = "sglang:cached_tokens / sglang:prompt_tokens"
        if queries is None or hits is None:
            continue
        if queries <= 0:
            skipped.append(f"{w.series}: no prefix-cache query {w.basis} (Δ queries = {queries:g})")
            continue
        out.append(
            {
                "source": f"metrics counters, {w.basis}",
                "window": w.basis,
                "series": w.series,
                "token_reuse": hits / queries,
                "token_reuse_mean": None,
                "external_reuse": None,
                "max_waiting": None,
                "samples": len(w.segment) if w.differenced else 1,
                "queried_tokens": queries,
                "hit_tokens": hits,
                "evidence": w.evidence(names, value=f"{hits:g} / {queries:g}")[-1],
            }
        )
    return out, skipped


IMPACT_BASIS = (
    "none: token reuse is a share of prompt tokens, not of request time or of requests (the prefill share of TTFT "
    "it could remove is not measured here): ranked by severity"
)


def check(ctx: Context) -> Check:
    metric_rows, skipped = _from_metrics(ctx)
    series = _from_logs(ctx) + metric_rows
    if not series:
        if skipped:
            return not_applicable(RULE, "missing prefix-cache statistics of the run: " + "; ".join(skipped))
        return not_applicable(
            RULE,
            "missing prefix-cache statistics: no 'Prefix cache hit rate' in the stats lines and no "
            "prefix_cache_hits/queries metrics (prefix caching off, or a vLLM without these fields)",
        )
    facts = startup_facts(ctx)
    enabled = {f.get("enable_prefix_caching", {}).get("value") for f in facts.values()} - {None}
    for s in series:  # tokens a KV connector served count as reused too
        s["combined_reuse"] = min(1.0, s["token_reuse"] + (s.get("external_reuse") or 0))
    worst = min(series, key=lambda s: s["combined_reuse"])
    table = [{k: v for k, v in s.items() if k != "evidence"} for s in series]
    values = {
        "token_reuse_rate": worst["token_reuse"],
        "token_reuse_source": worst["source"],
        "series": worst["series"],
        "request_hit_rate": None,
        "compute_saved": None,
        "not_measurable": "request hit rate and compute saved need per-request (n, h); vLLM logs, metrics and "
        "bench results give only token totals",
        "low_reuse_threshold": LOW_REUSE,
        "enable_prefix_caching": sorted(enabled) or None,
        "max_waiting_same_window": worst["max_waiting"],
        "window": worst.get("window"),
        "impact_basis": IMPACT_BASIS,
    }
    if skipped:
        values["series_without_a_window"] = skipped
    if worst.get("external_reuse") is not None:
        values["external_token_reuse_rate"] = worst["external_reuse"]
        values["combined_token_reuse_rate"] = worst["combined_reuse"]
    counts = f"{worst['hit_tokens']:g} / {worst['queried_tokens']:g} = " if worst.get("queried_tokens") else ""
    substituted = f"{worst['series']}: Σh / Σn = {counts}{worst['token_reuse'] * 100:.2f} % ({worst['source']})"
    where = f" ({worst['window']})" if worst.get("window") else ""
    evidence = [s["evidence"] for s in series][: ctx.settings.max_evidence]
    if worst["combined_reuse"] >= LOW_REUSE:
        ext = (
            f" ({worst['token_reuse'] * 100:.1f} % local + {worst['external_reuse'] * 100:.1f} % external)"
            if worst.get("external_reuse")
            else ""
        )
        return passed(
            RULE,
            confidence="medium",
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Prefix cache reuses {worst['combined_reuse'] * 100:.1f} % of prompt tokens{ext} ({worst['series']}"
                f"{', ' + worst['window'] if worst.get('window') else ''})"
            ),
        )
    queue = (
        f"; {worst['max_waiting']} {'request was' if worst['max_waiting'] == 1 else 'requests were'} waiting in "
        "the same window — with the queue held fixed the "
        "cache only removes prefill time; whether it lowers queueing must be measured (SCH003)"
        if worst["max_waiting"]
        else ""
    )
    return finding(
        RULE,
        severity="info",
        confidence="medium",
        impact=None,  # IMPACT_BASIS: no share of request time or of requests to rank by
        formula=FORMULA,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        title=(
            f"Prefix cache reuses only {worst['token_reuse'] * 100:.2f} % of prompt tokens{where}: it saves little "
            f"prefill here{queue}"
        ),
        next_check=(
            "A high request hit rate would not change this (90 % of requests can be 1.54 % of tokens and 0.344 % "
            "of prefill work): put stable content first in the prompt, check the chat template, and measure TTFT "
            "with the cache off, cold and warm before counting on it."
        ),
    )
