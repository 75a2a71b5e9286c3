"""SCH004 KV pressure & preemption.

Hypothesis: when the KV cache is nearly full, the scheduler cannot admit waiting requests and preempts
running ones (V0 swaps or recomputes them, V1 recomputes): work is redone and latency jumps. KV usage
near 100 % with preemptions rising means KV capacity, not compute, limits the batch.

Formula: per-token KV bytes 2·L·H_kv·D·b for full attention on every layer (KV heads, not attention heads;
4-bit weights do not make the KV 4-bit), from the shared model accounting: MLA caches one latent
L·(kv_lora_rank + qk_rope_head_dim)·b, sliding-window layers hold a bounded window and are not a per-token
cost; b from the engine's kv_cache_dtype, an FP8-KV kernel name, the checkpoint, or the model dtype; token capacity
floor((M_total − weights − runtime − margin) / per-token), a logical upper bound, not a concurrency setting;
paged tail waste ≤ A·(B−1) tokens for A non-empty sequences of block size B (reached when every length is
≡ 1 mod B; it bounds tail blocks only, not block tables or shared blocks). Thresholds: KV usage ≥ 90 % is
high, ≥ 95 % with requests waiting limits admission, "full" only at ≥ 99 %; any preemption (SGLang:
retraction) is a finding. Every title quotes one sample (its usage and queue) or says "max … at …". A /metrics
scrape with 0 running and 0 waiting is an idle snapshot, not the run's KV usage (scrapes taken before and after a
benchmark): it is left out, and with no other usage sample the rule is not applicable (or passes on a preemption
counter that did not move). Counters (num_preemptions, request_success) are read over the run: their difference
between scrapes ("between scrape 1 and 2 of FILE"), the lifetime ("since server start") for one scrape, never
across a reset. Impact, a share of request time: (Σ waiting at ≥ 95 % + Σ swapped) / Σ (running + waiting +
swapped) over the samples; else a share of requests: min(1, preemptions / finished requests); else none (ranked by
severity). High usage with nothing waiting or preempted has no impact.

Evidence: vLLM stats lines (GPU KV cache usage, V1 Preemptions, V0 Swapped/Pending), V0 preemption
warnings (total_num_cumulative_preemption), SGLang batch lines (token usage, #queue-req) and retractions (`KV
cache pool is full. Retract requests.`, before 2025 `Decode out of memory happened`: a retraction message alone,
without usage lines, is the finding — SGLang retracts only when the pool cannot hold the next decode step),
/metrics kv_cache_usage_perc (gpu_cache_usage_perc before 0.10), sglang:token_usage, num_preemptions and
sglang:num_retracted_requests; with a model config and the engine's reported KV size, the bytes per token,
capacity and tail-waste bound. Capacity walk: KV is resource evidence, read after load-test validity
(SCH009) and queue growth (SCH003) — a growing queue fills any cache.

What to do: shorter contexts or max_tokens, fewer concurrent sequences (max_num_seqs), KV-cache
quantization (kv_cache_dtype fp8), more memory per replica (gpu_memory_utilization, larger TP), or more
replicas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tracediag.analyses.kernels import kv_cache_dtype
from tracediag.analyses.serving import (
    counter_windows,
    input_paths,
    log_evidence,
    log_series,
    metric_series,
    series_evidence,
    startup_facts,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting
from tracediag.model.servingmath import paged_tail_waste_bound

RULE = RuleMeta(
    id="SCH004",
    step=6,
    title="KV cache has headroom and no request is preempted",
    may_be_downstream_of=("SCH003", "SCH011"),
    enabled_by=("--log", "--metrics"),
)
HIGH_PCT = 90.0
ADMISSION_PCT = 95.0
FULL_PCT = 99.0
FORMULA = (
    "KV usage ≥ 90 % high; ≥ 95 % with Waiting > 0 limits admission; ≥ 99 % full; preemptions > 0 redo work; "
    "tail waste ≤ A·(B−1)"
)


def _capacity(ctx: Context) -> dict:
    """Bytes per token and the engine's reported capacity, when a model config and startup facts exist."""
    m = ctx.model
    out: dict = {}
    if m is None:
        return out
    facts = next(iter(startup_facts(ctx).values()), {})
    p = int((facts.get("tensor_parallel_size") or {}).get("value_num") or (ctx.tp.p if ctx.tp else 1))
    kv = kv_cache_dtype(ctx)
    total = accounting.kv_bytes_per_token(m, 1, kv.b)
    if total is None:
        return out
    # The shared accounting: KV heads (not attention heads), MLA's one latent per layer, and only the layers
    # that keep every token (sliding-window layers hold a bounded window, not a per-token cost).
    out["kv_bytes_per_token"] = total
    out["kv_bytes_per_token_per_rank"] = accounting.kv_bytes_per_token(m, p, kv.b)
    out["kv_layout"] = accounting.kv_layout(m)
    out["kv_element_bytes"] = kv.b
    out["kv_element_source"] = kv.source
    tokens = (facts.get("kv_cache_tokens") or {}).get("value_num")
    blocks = (facts.get("num_gpu_blocks") or {}).get("value_num")
    if tokens:
        out["capacity_tokens"] = int(tokens)
    if tokens and blocks:
        out["block_size"] = round(tokens / blocks)
    return out


def _one_per_engine(rows) -> list[dict]:
    """SGLang retraction messages once per engine decision: every tensor-parallel rank of an engine runs the same
    scheduler and logs the same retraction (`[… TP8]` … `[… TP15]`, same second, same text); data-parallel ranks
    (`DPn`) decide apart."""
    seen, out = set(), []
    for r in rows:
        dp = re.search(r"(?<![A-Z_])DP\d+", r.get("process") or "")
        key = (r["input_id"], r["t_s"], r["text"], dp[0] if dp else None)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _where(s, p: dict) -> str:
    """Where a sample is: the log line and its time, or the scrape."""
    if s.source == "log":
        return f"{s.label} line {p.get('line')}" + (f" ({p['ts_text']})" if p.get("ts_text") else "")
    sc = p.get("scrape")
    return f"{s.label} scrape {sc + 1 if sc is not None else '?'}" + (
        f" (t = {p['t_s']:.0f} s)" if p.get("t_s") is not None else ""
    )


KV_PCT_MAX = 100.5  # engines round; a little over 100 % is a full cache, far over it is not a usage


@dataclass(frozen=True)
class KvUsage:
    """The KV usage samples over every series: the fullest, the fullest with a queue, the count of both, the idle
    scrapes left out, and the request sums behind the time shares (Σ over samples of requests in the engine)."""

    table: list[dict]
    n_samples: int
    n_admission: int
    worst_queued: tuple | None  # (kv %, waiting, series, index): the fullest sample with a queue
    worst: tuple | None  # (kv %, series, index): the fullest sample
    idle: list[str] = field(default_factory=list)  # scrapes with nothing running or waiting: not the run's usage
    in_engine: float = 0.0  # Σ (running + waiting + swapped) over the samples that give all three (or two)
    waiting_full: float = 0.0  # Σ waiting over those samples at ≥ ADMISSION_PCT
    swapped: float = 0.0  # Σ swapped (V0) over them
    counted: int = 0  # samples in those sums


def _scrape_gauges(ctx: Context) -> dict[tuple, list]:
    """(input_id, engine, scrape) -> [running, waiting] of that scrape (None where the scrape has no such gauge)."""
    out: dict[tuple, list] = {}
    for i, canonical in enumerate(("requests_running", "requests_waiting")):
        for s in metric_series(ctx, canonical):
            for j in range(len(s)):
                v = float(s.v[j])
                out.setdefault((s.input_id, s.engine, int(s.cols["scrape"][j])), [None, None])[i] = (
                    v if np.isfinite(v) else None
                )
    return out


def _counts(s, gauges: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """running, waiting, swapped per sample of a series (NaN where unknown): the log line's, or the same scrape's."""
    n = len(s)
    if s.source == "log":
        col = lambda k: s.cols[k].astype(float) if k in s.cols else np.full(n, np.nan)  # noqa: E731
        return col("running"), col("waiting"), col("swapped")
    rw = [gauges.get((s.input_id, s.engine, int(sc)), [None, None]) for sc in s.cols["scrape"]]
    run = np.array([np.nan if r is None else r for r, _ in rw], dtype=float)
    wait = np.array([np.nan if w is None else w for _, w in rw], dtype=float)
    return run, wait, np.full(n, np.nan)


def _usage(series: list, gauges: dict | None = None) -> KvUsage:
    table, idle = [], []
    n_samples, n_admission, counted = 0, 0, 0
    in_engine = waiting_full = swapped_sum = 0.0
    worst_queued: tuple | None = None
    worst: tuple | None = None
    for s in series:
        with np.errstate(over="ignore", invalid="ignore"):
            pct = s.v.astype(float) * (100.0 if s.source == "metrics" else 1.0)
        # a usage outside 0-100 % (a corrupt sample, ±1e308) is not a measurement: left out like a missing one
        pct[~np.isfinite(pct) | (pct < 0) | (pct > KV_PCT_MAX)] = np.nan
        running, waiting, swapped = _counts(s, gauges or {})
        if s.source == "metrics":  # a scrape taken while nothing runs or waits is an idle snapshot, not the run's
            quiet = (running == 0) & (waiting == 0) & ~np.isnan(pct)
            idle += [
                f"{_where(s, s.point(int(j)))} (running 0, waiting 0, KV {pct[j]:.1f} %)" for j in np.nonzero(quiet)[0]
            ]
            pct[quiet] = np.nan
        ok = ~np.isnan(pct)
        if not ok.any():
            continue
        n_samples += int(ok.sum())
        i = int(np.nanargmax(pct))
        if worst is None or pct[i] > worst[0]:
            worst = (float(pct[i]), s, i)
        wait0 = np.nan_to_num(waiting)
        queued = ok & (pct >= ADMISSION_PCT) & (wait0 > 0)
        n_admission += int(queued.sum())
        if queued.any():
            j = int(np.nonzero(queued)[0][np.argmax(pct[queued])])
            if worst_queued is None or pct[j] > worst_queued[0]:
                worst_queued = (float(pct[j]), int(wait0[j]), s, j)
        known = ok & ~np.isnan(running) & ~np.isnan(waiting)
        counted += int(known.sum())
        in_engine += float((running + waiting + np.nan_to_num(swapped))[known].sum())
        waiting_full += float(waiting[known & (pct >= ADMISSION_PCT)].sum())
        swapped_sum += float(np.nan_to_num(swapped)[known].sum())
        table.append(
            {
                "series": s.label,
                "samples": int(ok.sum()),
                "kv_max_pct": round(float(pct[i]), 3),
                "kv_last_pct": round(float(pct[ok][-1]), 3),
                "samples_over_admission_pct_with_queue": int(queued.sum()),
            }
        )
    return KvUsage(table, n_samples, n_admission, worst_queued, worst, idle, in_engine, waiting_full, swapped_sum,
                   counted)  # fmt: skip


@dataclass(frozen=True)
class Preemptions:
    """Preemptions: V1 per-interval counts, V0 swapped requests and warnings, SGLang retractions, /metrics counters
    over their window (the difference between scrapes; the lifetime for one scrape), and the finished requests
    of the same inputs (the denominator of the share of requests preempted)."""

    v1: list[dict]
    swapped: list[dict]
    warn: list[dict]
    n_v1: int
    n_warn: int
    n_retract: int
    n_metric: float
    max_swapped: int
    metric_windows: list = field(default_factory=list)  # CounterWindow with a preemption counter
    finished_metric: float | None = None  # request_success over the same windows
    finished_log: int = 0  # 'Finished request' lines, else successful POST access lines, of the logs

    @property
    def total(self) -> float:
        return self.n_v1 + self.n_warn + self.n_metric + self.n_retract

    @property
    def metric_basis(self) -> str | None:
        return "; ".join(f"{w.series}: {w.basis}" for w in self.metric_windows) or None


def _preemptions(ctx: Context) -> Preemptions:
    v1 = ctx.rows(
        "SELECT input_id, line, ts_text, t_s, preemptions FROM serving_stats WHERE preemptions > 0 "
        "ORDER BY input_id, t_s"
    )
    swapped = ctx.rows(
        "SELECT input_id, line, ts_text, t_s, swapped FROM serving_stats WHERE swapped > 0 "
        "ORDER BY swapped DESC LIMIT 5"
    )
    warn = ctx.rows(
        "SELECT input_id, line, ts_text, t_s, cumulative, mode, seq_group, kind, process, text FROM serving_events "
        "WHERE kind IN ('preemption', 'retraction') ORDER BY input_id, t_s"
    )
    windows = [w for w in counter_windows(ctx) if w.has("preemptions")]
    n_v1 = int(sum(r["preemptions"] for r in v1))
    v0 = [r for r in warn if r["kind"] == "preemption"]
    n_warn = max((r["cumulative"] or 0 for r in v0), default=0) or len(v0)
    n_retract = sum(r["cumulative"] or 1 for r in _one_per_engine(r for r in warn if r["kind"] == "retraction"))
    n_metric = float(sum(max(0.0, w.total("preemptions") or 0.0) for w in windows if not w.broken))
    finished = [w.total("request_success") for w in windows if not w.broken]
    finished_log = ctx.scalar(
        "SELECT coalesce(nullif(count(*) FILTER (WHERE kind = 'request_finished'), 0), count(*) FILTER (WHERE "
        "kind = 'access' AND http_status BETWEEN 200 AND 299 AND text LIKE 'POST %')) FROM serving_events"
    )
    max_swapped = max((r["swapped"] for r in swapped), default=0)
    return Preemptions(
        v1, swapped, warn, n_v1, n_warn, n_retract, n_metric, max_swapped, windows,
        float(sum(finished)) if finished and all(f is not None for f in finished) else None, int(finished_log or 0),
    )  # fmt: skip


def _evidence(ctx: Context, paths: dict, pre: Preemptions, use: KvUsage) -> list[dict]:
    evidence = []
    for r in pre.warn[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, f"{r['kind']} message", value=r["cumulative"]))
    for r in pre.swapped[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, "stats line (Swapped)", value=r["swapped"]))
    for r in pre.v1[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, "stats line (Preemptions)", value=r["preemptions"]))
    for w in pre.metric_windows[:1]:
        evidence += w.evidence("preemption counter", value=w.total("preemptions"), window=w.basis)
    if use.worst_queued:
        wq = use.worst_queued
        q = wq[2].point(wq[3])
        evidence.append(series_evidence(wq[2], q, "fullest KV sample with a queue (%)", value=wq[0], waiting=wq[1]))
    if use.worst:
        w = use.worst[1].point(use.worst[2])
        evidence.append(
            series_evidence(use.worst[1], w, "max KV usage sample (%)", value=use.worst[0], waiting=w.get("waiting"))
        )
    return evidence[: ctx.settings.max_evidence]


@dataclass(frozen=True)
class KvMeasure:
    """SCH004's numbers: KV usage, preemptions and the capacity account."""

    use: KvUsage
    pre: Preemptions
    kv_max: float
    values: dict
    evidence: list[dict]
    impact: float | None = None  # _impact: a share of request time or of requests, None without either
    impact_basis: str | None = None  # what `impact` is a share of, in a few words


def _impact(use: KvUsage, pre: Preemptions) -> tuple[float | None, str | None, str]:
    """(impact, its basis in a few words, the basis with its formula): the share of request time spent waiting
    at ≥ ADMISSION_PCT or swapped out (Σ over the samples of those requests / Σ of the requests in the engine: a
    time average when the samples are evenly spaced), else the share of requests preempted (preemptions per
    finished request, at most 1); None when the inputs count no requests beside the KV samples."""
    time_share = (use.waiting_full + use.swapped) / use.in_engine if use.in_engine > 0 else None
    finished = (pre.finished_metric or 0.0) + pre.finished_log
    count_share = min(1.0, pre.total / finished) if finished > 0 and pre.total > 0 else None
    if time_share is not None and (count_share is None or time_share >= count_share):
        return (
            time_share,
            "request time (waiting at a full KV cache or swapped out)",
            (
                f"share of request time: (Σ waiting at ≥ {ADMISSION_PCT:g} % KV + Σ swapped) / Σ (running + waiting + "
                f"swapped) = ({use.waiting_full:g} + {use.swapped:g}) / {use.in_engine:g} over {use.counted} samples"
            ),
        )
    if count_share is not None:
        return (
            count_share,
            "requests (preemptions per finished request)",
            (
                f"share of requests: min(1, preemptions / finished requests) = min(1, {pre.total:g} / {finished:g}) "
                "(a request preempted twice counts twice)"
            ),
        )
    return (
        None,
        None,
        "none: no request counts beside the KV samples (running/waiting or finished requests): ranked by severity",
    )


def measure(ctx: Context) -> KvMeasure | str:
    """Every number SCH004 judges by, or the reason (a string) it does not apply."""
    paths = input_paths(ctx)
    kv_logs = log_series(ctx, "kv_usage_pct", ("waiting", "running", "swapped"))
    kv_logs = [s for s in kv_logs if len(s) and not np.isnan(s.v.astype(float)).all()]
    kv_metrics = [s for s in metric_series(ctx, "kv_usage") if len(s)]
    pressure_messages = ctx.scalar("SELECT count(*) FROM serving_events WHERE kind IN ('preemption', 'retraction')")
    if not kv_logs and not kv_metrics and not pressure_messages:
        return (
            "missing KV-cache usage: no vLLM/SGLang stats lines, no kv_cache_usage_perc/token_usage metric and no "
            "preemption or retraction message"
        )
    use = _usage(kv_logs + kv_metrics, _scrape_gauges(ctx) if kv_metrics else None)
    worst = use.worst
    kv_max = worst[0] if worst else 0.0
    pre = _preemptions(ctx)
    counted = [w for w in pre.metric_windows if not w.broken]
    if not worst and use.idle and not pre.total and not pre.max_swapped and not counted:
        return (
            f"missing the run's KV-cache usage: {use.idle[0]} is an idle snapshot, not the run's KV usage"
            + (
                f" ({len(use.idle) - 1} more idle scrape{'s' if len(use.idle) > 2 else ''})"
                if len(use.idle) > 1
                else ""
            )
            + "".join(f"; preemptions unknown, {w.series}: {w.basis}" for w in pre.metric_windows)
            + "; scrape /metrics while the load runs (`tracediag scrape` during the benchmark), or pass the engine log"
        )
    impact, basis, basis_long = _impact(use, pre)
    values = {
        "kv_usage_max_pct": round(kv_max, 3),
        "kv_usage_max_at": _where(worst[1], worst[1].point(worst[2])) if worst else None,
        "high_threshold_pct": HIGH_PCT,
        "admission_threshold_pct": ADMISSION_PCT,
        "full_threshold_pct": FULL_PCT,
        "preemptions_v1_intervals": pre.n_v1,
        "preemptions_v0_cumulative": pre.n_warn,
        "retractions_sglang": pre.n_retract,
        "preemptions_metric_total": pre.n_metric,
        "preemptions_metric_window": pre.metric_basis,
        "swapped_max": pre.max_swapped,
        "samples": use.n_samples,
        "samples_full_with_waiting": use.n_admission,
        "idle_snapshots": use.idle or None,
        "impact": round(impact, 4) if impact is not None else None,
        "impact_basis": basis_long,
    } | _capacity(ctx)
    if values.get("block_size") and kv_logs:
        a = int(max(np.nanmax(np.nan_to_num(s.cols["running"].astype(float))) for s in kv_logs))
        values["tail_waste_bound_tokens"] = paged_tail_waste_bound(a, values["block_size"])
        values["active_sequences_max"] = a
    return KvMeasure(use, pre, kv_max, values, _evidence(ctx, paths, pre, use), impact, basis)


def _substituted(ms: KvMeasure) -> str:
    values, pre, use = ms.values, ms.pre, ms.use
    substituted = (
        (f"max KV usage {ms.kv_max:.1f} % ({values['kv_usage_max_at']})" if use.worst else _no_usage(use))
        + f"; preemptions {pre.total:g} (V1 {pre.n_v1}, "
        f"V0 {pre.n_warn}, SGLang retractions {pre.n_retract}, metrics {pre.n_metric:g}"
        + (f" {pre.metric_basis}" if pre.metric_basis else "")
        + "), max swapped "
        f"{pre.max_swapped}; {use.n_admission} of {use.n_samples} samples ≥ {ADMISSION_PCT:g} % with requests waiting"
    )
    if use.worst and use.idle:
        substituted += f"; left out as idle snapshots (not the run's KV usage): {'; '.join(use.idle[:3])}"
    if ms.impact:
        substituted += f"; impact {values['impact_basis']} = {ms.impact:.3f}"
    if "kv_bytes_per_token" in values:
        substituted += (
            f"; per-token KV {values['kv_bytes_per_token']:,.0f} B ({values['kv_layout']}; b = "
            f"{values['kv_element_bytes']:g} B from {values['kv_element_source']})"
        )
    if "tail_waste_bound_tokens" in values:
        substituted += (
            f"; tail waste ≤ A·(B−1) = {values['active_sequences_max']}·({values['block_size']}−1) = "
            f"{values['tail_waste_bound_tokens']:,} tokens"
        )
    return substituted


def _no_usage(use: KvUsage) -> str:
    if use.idle:
        return f"KV usage not measured during the run ({use.idle[0]} is an idle snapshot, not the run's KV usage)"
    return "no KV usage samples"


NEXT_CHECK = (
    "First rule out a growing queue (SCH003) and an invalid load test (SCH009): more arrivals than completions "
    "fill any cache. Then shorten contexts or max_tokens, lower max_num_seqs, quantize the KV cache "
    "(kv_cache_dtype=fp8), or give each replica more KV memory (gpu_memory_utilization, larger TP) or add "
    "replicas; check SCH005 for the capacity the engine actually got."
)


def judge(ms: KvMeasure) -> Check:
    """Status, severity and words from SCH004's numbers."""
    values, pre, use, kv_max, worst = ms.values, ms.pre, ms.use, ms.kv_max, ms.use.worst
    common = {
        "formula": FORMULA,
        "substituted": _substituted(ms),
        "values": values,
        "table": use.table,
        "evidence": ms.evidence,
    }
    ranked = {"impact": ms.impact, "impact_basis": ms.impact_basis if ms.impact is not None else None}
    full_word = "full" if kv_max >= FULL_PCT else "under pressure"
    if pre.total > 0 or pre.max_swapped > 0:
        what = []
        if pre.n_v1 or pre.n_warn or pre.n_metric:
            what.append(f"{pre.n_v1 + pre.n_warn + pre.n_metric:g} preemptions")
        if pre.n_metric and pre.metric_basis:
            what[-1] += f" ({pre.metric_basis})"
        if pre.n_retract:
            what.append(f"{pre.n_retract} retracted (SGLang)")
        if pre.max_swapped:
            what.append(f"up to {pre.max_swapped} swapped")
        usage = (
            f"max KV usage {kv_max:.1f} % at {values['kv_usage_max_at']}"
            if worst
            else _no_usage(use)
            if use.idle
            else "KV usage not in these inputs (the engine ran out of KV blocks to retract them)"
        )
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            next_check=NEXT_CHECK,
            **ranked,
            **common,
            title=(
                f"Requests preempted: {', '.join(what)}; {usage}"
                if not worst and use.idle
                else f"KV cache {full_word if worst else 'full'}, requests preempted: {', '.join(what)}; {usage}"
            ),
        )
    if use.worst_queued:
        pct, waiting, ws, j = use.worst_queued
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            next_check=NEXT_CHECK,
            **ranked,
            **common,
            title=(
                f"KV cache {'full' if pct >= FULL_PCT else 'limits admission'}: {pct:.1f} % used while {waiting} "
                f"requests wait ({_where(ws, ws.point(j))}); {use.n_admission} of {use.n_samples} samples ≥ "
                f"{ADMISSION_PCT:g} % with a queue"
            ),
        )
    if kv_max >= HIGH_PCT:
        return finding(
            RULE,
            severity="info",
            confidence="medium",
            impact=None,  # nothing waits or is preempted yet: no request time lost to rank by
            next_check="Watch for preemptions as load grows; " + NEXT_CHECK,
            **common,
            title=(
                f"KV cache usage high: max {kv_max:.1f} % at {values['kv_usage_max_at']} (no preemption, no request "
                "waiting at ≥ 95 %)"
            ),
        )
    if not worst:  # idle snapshots only, and a preemption counter that did not move
        return passed(
            RULE,
            confidence="medium",
            **common,
            title=f"No request preempted ({pre.metric_basis}); {_no_usage(use)}",
        )
    return passed(
        RULE,
        confidence="high",
        **common,
        title=f"KV cache has headroom: max usage {kv_max:.1f} % ({values['kv_usage_max_at']}), no preemption",
    )


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ms)
