"""SCH012 TTFT decomposition.

Hypothesis: a slow first token is either waiting (the request sits in the engine's queue: capacity), computing
(the prefill of its prompt: prefill cost), or neither (tokenization, the frontend, a KV connector loading or
receiving the prompt's KV from another instance, the first output's trip back). The three call for different
fixes, so TTFT is split before anything is tuned: with the queue held fixed, a faster prefill (or a prefix cache)
removes only the prefill share (Jellow, "前缀缓存命中率很高，首字为什么还是慢？" — "a high prefix-cache hit rate, so
why is the first token still slow?" —, in the series 模型推理加速专题, one of the project's source articles: 800 ms
queue + 200 ms prefill → 820 ms, 1.22×).

Formula: over the window (between the first and last timed scrape, else between the first and last untimed scrape
when no count fell between them, or since the process started for one scrape)
and per scrape interval, from the engines' request-phase histograms: mean queue = Δsum/Δcount of
vllm:request_queue_time_seconds (first QUEUED → first SCHEDULED), mean prefill = of
vllm:request_prefill_time_seconds (first SCHEDULED → first token, preemptions during prefill included), mean
TTFT = of vllm:time_to_first_token_seconds (arrival at the frontend → first token), rest = TTFT − queue −
prefill (vllm/v1/metrics/stats.py update_from_finished_request; SGLang: sglang:queue_time_seconds, waiting queue →
forward, and sglang:time_to_first_token_seconds, with no prefill histogram: prefill and the rest together).
Shares of the mean TTFT; the component with ≥ 50 % dominates. Queue and prefill are observed when a request
finishes, TTFT at its first token: in a window their request counts differ by the requests in flight at its ends
(both counts are shown). Quantiles p50/p90/p99 of each histogram as Prometheus's histogram_quantile (linear in the
bucket) with their error bounds, the bucket's edges. KV connectors, when their metrics exist, are counted apart:
NIXL vllm:nixl_xfer_time_seconds and LMCache lmcache:time_to_retrieve (seconds per transfer/load; their sum over
the window divided by the TTFT count is the time per request). Findings: queueing dominates (capacity) or the rest
dominates (frontend, KV transfer); warning when the mean TTFT is ≥ 100 ms (below, it costs little: info).
Prefill dominating is a pass: the first token waits for compute, as it should. A benchmark summary without
/metrics: plausible prefill = max(max(2·N_active·L_in / peak, W / BW) / 0.3, mean TPOT) of the mean prompt L_in
(model config at TP = 1, --peak-tflops / --hbm-bandwidth); a mean TTFT ≥ 3 × that is waiting at the server (at
least 1 − plausible / TTFT of it), warning from 100 ms.

Evidence: the histograms' sums, counts and buckets per engine (vLLM `engine`, SGLang dp/tp rank labels), first and
last scrape, the per-interval split.

What to do: queueing → SCH003 and SCH013 (is the queue growing; is one engine or the router the cause), lower the
rate, add replicas or raise max_num_seqs if KV allows (SCH004); prefill → prompt lengths, prefix caching (SCH006),
chunked prefill and max_num_batched_tokens (SCH002); the rest → tokenizer and frontend CPU, the KV connector's
transfer time and bandwidth (NIXL/LMCache), the network to the client.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from tracediag.analyses.serving import (
    bench_evidence,
    bench_runs,
    bench_stat,
    input_paths,
    metric_evidence,
    run_label,
    series_label,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting
from tracediag.model.servingmath import histogram_quantile

RULE = RuleMeta(
    id="SCH012",
    step=6,
    title="TTFT is not dominated by waiting or by time outside the engine",
    may_be_downstream_of=("SCH009", "SCH011", "SCH003", "SCH013"),
    enabled_by=("--metrics", "--bench", "--model config.json", "--peak-tflops", "--hbm-bandwidth"),
)
PHASES = ("ttft_seconds", "queue_time_seconds", "prefill_time_seconds", "kv_transfer_seconds", "kv_load_seconds")
DOMINANT = 0.5  # share of the mean TTFT that makes a component the dominant one
SLOW_TTFT_S = 0.1  # a mean TTFT below this costs little: a dominant queue is then info
QUANTILES = (0.5, 0.9, 0.99)
MAX_INTERVAL_ROWS = 60
# A benchmark summary alone (no /metrics): the mean TTFT against a plausible prefill of the mean prompt — the
# larger of the compute floor 2·N_active·L_in / peak and the weight read W / bandwidth, at PREFILL_EFFICIENCY of
# those peaks (a datasheet peak is an upper bound; prefill reaches a fraction of it), and at least one engine step
# (the mean TPOT: a short prompt's prefill takes a step like a decode does). A mean TTFT of WAITING_FACTOR
# plausible prefills or more is time spent waiting at the server at that load.
PREFILL_EFFICIENCY = 0.3
WAITING_FACTOR = 3.0
SUMMARY_FORMULA = (
    "plausible prefill = max(max(2·N_active·L_in / peak, W / BW) / efficiency, mean TPOT); "
    "L_in = total input tokens / completed; waiting when mean TTFT ≥ 3 × plausible prefill; "
    "waiting share ≥ 1 − plausible / mean TTFT"
)
FORMULA = (
    "mean X = Δsum_X/Δcount_X over the window; TTFT = queue + prefill + rest; share = mean X / mean TTFT; "
    "dominant when share ≥ 0.5"
)


def _histograms(ctx: Context) -> dict[tuple, dict[str, list[dict]]]:
    """(input_id, engine) -> canonical -> per timed-or-single scrape {scrape, t_s, ts_ns, line, sum, count, buckets}."""
    rows = ctx.rows(
        "SELECT input_id, engine, canonical, part, le, scrape, min(t_s) AS t_s, min(ts_ns) AS ts_ns, "
        "min(line) AS line, sum(value) AS value FROM metric_samples WHERE preferred AND canonical IN "
        f"({', '.join('?' for _ in PHASES)}) AND part IN ('sum', 'count', 'bucket') "
        "GROUP BY input_id, engine, canonical, part, le, scrape ORDER BY input_id, engine, canonical, scrape",
        list(PHASES),
    )
    out: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        sc = out[(r["input_id"], r["engine"])][r["canonical"]].setdefault(
            r["scrape"],
            {"scrape": r["scrape"], "t_s": r["t_s"], "ts_ns": r["ts_ns"], "line": r["line"], "buckets": {}},
        )
        if r["part"] == "bucket":
            if r["le"] is not None:
                sc["buckets"][r["le"]] = sc["buckets"].get(r["le"], 0.0) + (r["value"] or 0.0)
        else:
            sc[r["part"]] = r["value"]
    return {k: {c: [v[s] for s in sorted(v)] for c, v in by.items()} for k, by in out.items()}


def _delta(a: dict | None, b: dict) -> dict:
    """b − a of one histogram (a None: b itself, everything since the process started)."""
    if a is None:
        return {"sum": b.get("sum"), "count": b.get("count"), "buckets": dict(b["buckets"])}
    return {
        "sum": None if b.get("sum") is None or a.get("sum") is None else b["sum"] - a["sum"],
        "count": None if b.get("count") is None or a.get("count") is None else b["count"] - a["count"],
        "buckets": {le: v - a["buckets"].get(le, 0.0) for le, v in b["buckets"].items()},
    }


def _mean(d: dict | None) -> float | None:
    if not d or not d.get("count") or d.get("sum") is None or d["count"] <= 0:
        return None
    return d["sum"] / d["count"]


def _quantiles(d: dict | None) -> dict[str, Any]:
    if not d or not d["buckets"]:
        return {}
    out = {}
    for q in QUANTILES:
        hq = histogram_quantile(list(d["buckets"].items()), q)
        if hq is not None:
            out[f"p{q * 100:g}"] = {"estimate_s": round(hq.estimate, 6), "bounds_s": [hq.low, hq.high]}
    return out


def _split(phase: dict[str, dict | None]) -> dict[str, Any] | None:
    """The TTFT split of one window: means, shares, which dominates; None without TTFT and queue means."""
    ttft, queue, prefill = (_mean(phase.get(k)) for k in ("ttft_seconds", "queue_time_seconds", "prefill_time_seconds"))
    if ttft is None or queue is None or ttft <= 0:
        return None
    rest = ttft - queue - (prefill or 0.0)
    parts = {"queue": queue, "prefill": prefill, "rest": rest}
    shares = {k: (max(0.0, v) / ttft if v is not None else None) for k, v in parts.items()}
    dominant = max((k for k in shares if shares[k] is not None), key=lambda k: shares[k])
    xfer = sum(
        (phase[k]["sum"] or 0.0) for k in ("kv_transfer_seconds", "kv_load_seconds") if phase.get(k) and phase[k]["sum"]
    )
    n_ttft = phase["ttft_seconds"]["count"]
    return {
        "ttft_mean_s": ttft,
        "queue_mean_s": queue,
        "prefill_mean_s": prefill,
        "rest_mean_s": rest,
        "queue_share": shares["queue"],
        "prefill_share": shares["prefill"],
        "rest_share": shares["rest"],
        "dominant": dominant if shares[dominant] >= DOMINANT else None,
        "requests_ttft": n_ttft,
        "requests_queue": phase["queue_time_seconds"]["count"],
        "requests_prefill": phase["prefill_time_seconds"]["count"] if phase.get("prefill_time_seconds") else None,
        "kv_transfer_per_request_s": xfer / n_ttft if xfer and n_ttft else None,
    }


def _windows(by: dict[str, list[dict]]) -> tuple[dict[str, dict | None], str, list[dict]]:
    """The window's deltas per phase, how the window is defined, and the per-interval splits."""
    timed = {c: [s for s in v if s["t_s"] is not None] for c, v in by.items()}
    n_timed = min((len(v) for c, v in timed.items() if c in ("ttft_seconds", "queue_time_seconds")), default=0)
    if n_timed >= 2:
        window = {c: _delta(v[0], v[-1]) if len(v) >= 2 else None for c, v in timed.items()}
        t0 = timed["ttft_seconds"][0]["t_s"]
        t1 = timed["ttft_seconds"][-1]["t_s"]
        how = f"between the first and last of {n_timed} timed scrapes ({t1 - t0:.0f} s)"
        intervals = []
        for i in range(1, n_timed):
            ph = {c: _delta(v[i - 1], v[i]) if len(v) > i else None for c, v in timed.items()}
            sp = _split(ph)
            if sp is not None and (sp["requests_ttft"] or 0) > 0:
                intervals.append({"t_s": timed["ttft_seconds"][i]["t_s"]} | {k: _round(v) for k, v in sp.items()})
        return window, how, intervals
    # untimed scrapes (`curl …/metrics` before and after a run): the run is what the histograms gained between the
    # first and the last, unless a count fell in between (a restart: the difference is not the run's)
    n = min((len(v) for c, v in by.items() if c in ("ttft_seconds", "queue_time_seconds")), default=0)
    if n >= 2:
        window = {c: _delta(v[0], v[-1]) if len(v) >= 2 else None for c, v in by.items()}
        restarted = any(
            (b.get("count") or 0) < (a.get("count") or 0) for v in by.values() for a, b in itertools.pairwise(v)
        )
        if not restarted:
            return window, f"between scrape 1 and {n} (untimed: in the order given)", []
    last = {c: v[-1] for c, v in by.items() if v}
    return {c: _delta(None, s) for c, s in last.items()}, "since the process started (one scrape: cumulative)", []


def _round(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def _ms(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v:.3g} s" if abs(v) >= 1 else f"{v * 1000:.3g} ms"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:.0f} %"


def _plausible_prefill(ctx: Context, l_in: float, tpot_ms: float | None) -> tuple[float | None, dict[str, Any], str]:
    """(seconds, values, why not) of a plausible prefill of `l_in` tokens on one GPU at TP = 1 (a TP group shares
    the work: the estimate is then larger than the real one, so waiting is understated, never invented), and at
    least one engine step — the run's mean TPOT — since a prefill is scheduled into a step like any other."""
    m = ctx.model
    if m is None:
        return None, {}, "missing the model config (--model config.json): no parameter count for a prefill time"
    peak = ctx.settings.peak_tflops * 1e12 if ctx.settings.peak_tflops else None
    bw = ctx.settings.hbm_bandwidth_gbs * 1e9 if ctx.settings.hbm_bandwidth_gbs else None
    if peak is None and bw is None:
        return (
            None,
            {},
            ("missing the GPU's peaks (--peak-tflops, --hbm-bandwidth): a benchmark summary does not name its GPU"),
        )
    n_active = accounting.active_params_per_token(m, 1)
    w = accounting.weight_bytes(m, 1)
    compute_s = 2 * n_active * l_in / peak if peak else None
    read_s = w / bw if bw else None
    floor = max(x for x in (compute_s, read_s) if x is not None)
    values = {
        "mean_input_tokens": round(l_in, 1),
        "active_params_per_token": n_active,
        "weight_bytes": w,
        "peak_tflops": ctx.settings.peak_tflops,
        "hbm_bandwidth_gbs": ctx.settings.hbm_bandwidth_gbs,
        "compute_floor_ms": compute_s * 1000 if compute_s is not None else None,
        "weight_read_floor_ms": read_s * 1000 if read_s is not None else None,
        "prefill_efficiency": PREFILL_EFFICIENCY,
        "one_step_ms": tpot_ms,
        "tp_assumed": 1,
    }
    plausible = max(floor / PREFILL_EFFICIENCY, (tpot_ms or 0) / 1000)
    values["plausible_prefill_ms"] = plausible * 1000
    return plausible, values, ""


def _from_bench(ctx: Context) -> Check | None:
    """A benchmark summary without /metrics: is the mean TTFT far above a plausible prefill of the mean prompt?"""
    runs = [r for r in bench_runs(ctx) if r["completed"] and r["total_input_tokens"]]
    runs = [(r, bench_stat(ctx, r["input_id"], r["run"], "ttft", "mean")) for r in runs]
    runs = [(r, t) for r, t in runs if t]
    if not runs:
        return None
    table, judged = [], []
    why_not = ""
    for r, ttft_ms in runs:
        l_in = r["total_input_tokens"] / r["completed"]
        tpot_ms = bench_stat(ctx, r["input_id"], r["run"], "tpot", "mean")
        plaus_s, values, why_not = _plausible_prefill(ctx, l_in, tpot_ms)
        row = {
            "run": run_label(r),
            "mean_ttft_ms": ttft_ms,
            "mean_input_tokens": round(l_in, 1),
            "max_concurrency": r["max_concurrency"],
            "plausible_prefill_ms": values.get("plausible_prefill_ms"),
        }
        if plaus_s is not None:
            row["ttft_over_plausible"] = ttft_ms / 1000 / plaus_s
            judged.append((r, ttft_ms, plaus_s, values))
        table.append(row)
    if not judged:
        r, ttft_ms = runs[0]
        return not_applicable(
            RULE,
            f"{why_not}. The benchmark summary's mean TTFT ({ttft_ms:.3g} ms, {run_label(r)}) cannot be split into "
            "waiting and prefill without /metrics histograms or a plausible prefill time",
        )
    r, ttft_ms, plaus_s, values = max(judged, key=lambda j: j[1] / 1000 / j[2])
    ratio = ttft_ms / 1000 / plaus_s
    tpot_txt = "?" if values["one_step_ms"] is None else f"{values['one_step_ms']:.3g} ms"
    values |= {"mean_ttft_ms": ttft_ms, "ttft_over_plausible": ratio, "waiting_factor": WAITING_FACTOR,
               "source": "benchmark summary (no per-phase histograms)"}  # fmt: skip
    substituted = (
        f"{run_label(r)}: mean TTFT {ttft_ms:.3g} ms vs a plausible prefill of {values['mean_input_tokens']:g} tokens "
        f"{values['plausible_prefill_ms']:.3g} ms = max(max(compute {values['compute_floor_ms'] or 0:.3g} ms, weight "
        f"read {values['weight_read_floor_ms'] or 0:.3g} ms) / {PREFILL_EFFICIENCY:g}, one step {tpot_txt}) → "
        f"{ratio:.1f}×"
    )
    common = {"formula": SUMMARY_FORMULA, "substituted": substituted, "values": values, "table": table,
              "evidence": [bench_evidence(r, metric="mean_ttft_ms", value=ttft_ms)]}  # fmt: skip
    if ratio < WAITING_FACTOR:
        return passed(
            RULE,
            confidence="low",
            **common,
            title=(
                f"Mean TTFT {ttft_ms:.3g} ms is within {WAITING_FACTOR:g}× a plausible prefill "
                f"({values['plausible_prefill_ms']:.3g} ms) of the mean prompt: no sign of waiting at the server"
            ),
        )
    share = 1 - plaus_s / (ttft_ms / 1000)
    return finding(
        RULE,
        severity="warning" if ttft_ms / 1000 >= SLOW_TTFT_S else "info",
        confidence="medium",
        impact=share,
        impact_basis="mean TTFT",
        **common,
        title=(
            f"Mean TTFT {ttft_ms:.3g} ms is {ratio:.0f}× a plausible prefill of the mean prompt "
            f"({values['mean_input_tokens']:g} tokens, {values['plausible_prefill_ms']:.3g} ms): at least "
            f"{share:.0%} of it is waiting at the server — it is saturated at this load"
        ),
        next_check=(
            "Capacity, not prefill cost: scrape /metrics before and after the run (vllm:request_queue_time_seconds, "
            "sglang:queue_time_seconds) to measure the queue, check whether it grows (SCH003); lower the rate or "
            "concurrency, add replicas, or raise max_num_seqs if KV allows (SCH004)."
        ),
    )


def _series_splits(with_ttft: dict[tuple, dict[str, list[dict]]], paths: dict) -> tuple[list[dict], list[tuple]]:
    """Per (input, engine) series with a TTFT histogram: its table row (window, quantiles, the split when it can
    be made, intervals thinned to MAX_INTERVAL_ROWS), and the series that split as (label, split, histograms,
    intervals, window, input id)."""
    table, splits = [], []
    for (iid, engine), by in sorted(with_ttft.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        window, how, intervals = _windows(by)
        sp = _split(window)
        label = series_label(paths.get(iid, "?"), engine)
        row = {
            "series": label,
            "window": how,
            "has_queue_histogram": "queue_time_seconds" in by,
            "has_prefill_histogram": "prefill_time_seconds" in by,
            "quantiles": {c: _quantiles(window.get(c)) for c in PHASES if window.get(c)},
        }
        if sp is not None:
            row |= {k: _round(v) for k, v in sp.items()}
            splits.append((label, sp, by, intervals, how, iid))
        if intervals:
            step = max(1, len(intervals) // MAX_INTERVAL_ROWS)
            row["intervals"] = intervals[::step]
        table.append(row)
    return table, splits


def _histogram_evidence(path: str, by: dict[str, list[dict]]) -> list[dict]:
    """The last scrape of each TTFT-part histogram the series has."""
    return [
        metric_evidence(path, by[c][-1], f"{c} histogram (last scrape)", count=by[c][-1].get("count"))
        for c in (
            "ttft_seconds",
            "queue_time_seconds",
            "prefill_time_seconds",
            "kv_transfer_seconds",
            "kv_load_seconds",
        )
        if c in by
    ]


def check(ctx: Context) -> Check:
    hist = _histograms(ctx)
    with_ttft = {k: v for k, v in hist.items() if "ttft_seconds" in v}
    if not with_ttft:
        from_bench = _from_bench(ctx)
        if from_bench is not None:
            return from_bench
        return not_applicable(
            RULE,
            "missing TTFT histogram: no vllm:time_to_first_token_seconds / sglang:time_to_first_token_seconds in "
            "the /metrics inputs (pass a scrape with --metrics; `tracediag scrape` takes timed ones)",
        )
    paths = input_paths(ctx)
    table, splits = _series_splits(with_ttft, paths)
    if not splits:
        missing = "queue-time histogram" if not any(r["has_queue_histogram"] for r in table) else "requests"
        return not_applicable(
            RULE,
            f"missing {missing}: TTFT cannot be split without vllm:request_queue_time_seconds / "
            "sglang:queue_time_seconds observations beside the TTFT histogram",
        )
    label, sp, by, _intervals, how, iid = max(splits, key=lambda x: x[1]["requests_ttft"] or 0)
    evidence = _histogram_evidence(paths.get(iid, "?"), by)
    values = {k: _round(v) for k, v in sp.items()} | {
        "series": label,
        "window": how,
        "dominant_threshold": DOMINANT,
        "series_split": len(splits),
        "quantiles": next(r["quantiles"] for r in table if r["series"] == label),
    }
    prefill_txt = _ms(sp["prefill_mean_s"]) if sp["prefill_mean_s"] is not None else "not measured (SGLang)"
    substituted = (
        f"{label}: TTFT {_ms(sp['ttft_mean_s'])} = queue {_ms(sp['queue_mean_s'])} ({_pct(sp['queue_share'])}) + "
        f"prefill {prefill_txt} ({_pct(sp['prefill_share'])}) + rest {_ms(sp['rest_mean_s'])} "
        f"({_pct(sp['rest_share'])}), {how}; {sp['requests_ttft']:g} first tokens, {sp['requests_queue']:g} queue "
        "observations"
    )
    if sp["kv_transfer_per_request_s"] is not None:
        substituted += f"; KV connector transfer/load {_ms(sp['kv_transfer_per_request_s'])} per request"
    common = {"formula": FORMULA, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    dom = sp["dominant"]
    severity = "warning" if sp["ttft_mean_s"] >= SLOW_TTFT_S else "info"
    if dom == "queue":
        return finding(
            RULE,
            severity=severity,
            confidence="high" if (sp["requests_ttft"] or 0) >= 20 else "medium",
            impact=sp["queue_share"],
            impact_basis="mean TTFT",
            **common,
            title=(
                f"Queueing is {_pct(sp['queue_share'])} of TTFT ({_ms(sp['queue_mean_s'])} of {_ms(sp['ttft_mean_s'])} "
                f"mean on {label}): requests wait for capacity, not for prefill"
            ),
            next_check=(
                "Capacity, not prefill cost: check whether the queue grows (SCH003) and whether one engine or the "
                "router holds it (SCH013); lower the rate or add replicas, or raise max_num_seqs if KV allows "
                "(SCH004). A faster prefill or a prefix cache would remove only the prefill share."
            ),
        )
    if dom == "rest":
        kv = sp["kv_transfer_per_request_s"]
        where = (
            f"KV connector transfer/load is {_ms(kv)} of it per request"
            if kv is not None
            else "outside the engine's queue and prefill: tokenization, the frontend, a KV transfer, the network"
        )
        return finding(
            RULE,
            severity=severity,
            confidence="medium",
            impact=sp["rest_share"],
            impact_basis="mean TTFT",
            **common,
            title=(
                f"{_pct(sp['rest_share'])} of TTFT ({_ms(sp['rest_mean_s'])} of {_ms(sp['ttft_mean_s'])} mean on "
                f"{label}) is neither queueing nor prefill: {where}"
            ),
            next_check=(
                "Look outside the scheduler: tokenizer and API-server CPU (multiple API servers, "
                "--api-server-count), the KV connector's transfer time and bandwidth (NIXL, LMCache), detokenization "
                "and the network to the client."
            ),
        )
    what = (
        f"prefill is {_pct(sp['prefill_share'])} of it"
        if dom == "prefill"
        else f"no part dominates (queue {_pct(sp['queue_share'])}, rest {_pct(sp['rest_share'])})"
    )
    return passed(
        RULE,
        confidence="medium",
        **common,
        title=f"TTFT {_ms(sp['ttft_mean_s'])} mean on {label}: {what}; queueing is {_pct(sp['queue_share'])}",
    )
