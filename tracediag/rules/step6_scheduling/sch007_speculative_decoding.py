"""SCH007 Speculative decoding.

Hypothesis: speculative decoding emits E[tokens/round] tokens per target-model round; it pays only when a
round (draft + verify + overhead) costs less than E plain decode steps. Acceptance falls with position,
so trailing positions add little while their draft and verify work is always paid; and on a busy server
the verify work of rejected drafts takes batch capacity that waiting requests need.

Formula: per-position joint acceptance P(A1…Ai) (vLLM's "per-position acceptance rate" = accepted at
position i / drafts); conditional P(Ai | A1…Ai−1) = P(A1…Ai) / P(A1…Ai−1);
E[tokens/round] = 1 + Σ_i P(A1…Ai) (constant α: 1 + α + … + α^k; k=4, α=0.8 → 3.3616; α=0.3 → 1.43);
break-even: T_round / E < T_base, i.e. T_round < E·T_base; position k adds P(A1…Ak) tokens per round.
Findings: a trailing position adding < 0.1 token per round; rejected drafts ≥ 50 % of verified draft
tokens while requests wait; a sustained decay of acceptance over time on one engine (Mann-Kendall one-sided
for a decrease, α = 0.05, on the per-interval acceptance in time order, same-second lines by position; the Sen
drop −slope × window must reach 10 % of the engine's median acceptance) — the draft model fits the traffic less
as it goes (a workload shift, a longer context than the draft was trained on, a weight update the draft missed).
SGLang prints per interval `accept len` = (accepted drafts + 1) per verify round, which is E itself, and `accept
rate` = the same count over the draft tokens verified; it has no per-position counts, so the trailing-position
test needs vLLM's.

Evidence: V1 'SpecDecoding metrics' lines (per logging interval), V0 'Speculative metrics' lines (totals;
E = emitted / (draft tokens / k)), SGLang decode lines with `accept len`/`accept rate` (per engine: DP rank or TP
rank), /metrics spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens(_per_pos) counters; Waiting
from the stats line of the same engine and time; the acceptance series per engine with its trend.

What to do: lower num_speculative_tokens to drop low-yield positions; with a queue, disable speculative
decoding or lower k (it trades throughput for single-request latency); measure T_round and T_base before
keeping it on; on a decay, compare the traffic before and after (prompt lengths, languages, tasks) and the draft
model's training data, and re-check after a weight update.
"""

from __future__ import annotations

import json

from tracediag.analyses.serving import (
    MIN_TREND_POINTS,
    SIGNIFICANCE,
    input_paths,
    log_evidence,
    metric_evidence,
    series_label,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import (
    DRIFT_MIN_DROP,
    acceptance_drift,
    conditional_acceptance,
    expected_tokens_per_round,
    spread_ties,
)

RULE = RuleMeta(
    id="SCH007",
    step=6,
    title="Speculative decoding yields enough tokens per round",
    may_be_downstream_of=("SCH009", "SCH003"),
    enabled_by=("--log", "--metrics"),
)
MIN_TAIL_YIELD = 0.10  # tokens per round a trailing draft position must add
MAX_REJECTED_UNDER_LOAD = 0.5  # share of verified draft tokens rejected while requests wait
FORMULA = "E[tokens/round] = 1 + Σ_i P(A1…Ai); pays off only if T_round < E·T_base"


def _log_groups(ctx: Context) -> list[dict]:
    paths = input_paths(ctx)
    rows = ctx.rows("SELECT * FROM spec_decode ORDER BY input_id, engine NULLS FIRST, pid NULLS FIRST, t_s, line")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["input_id"], r["engine"], r["pid"]), []).append(r)
    out = []
    for (input_id, engine, pid), rs in groups.items():
        path = paths.get(input_id, "?")
        label = series_label(path, engine)
        waits = {
            r["line"]: r["waiting"]
            for r in ctx.rows(
                "SELECT line, waiting FROM serving_stats WHERE input_id = ? AND pid IS NOT DISTINCT FROM ? "
                "AND engine IS NOT DISTINCT FROM ?",
                [input_id, pid, engine],
            )
        }
        for r in rs:  # the stats line the spec line follows (same process, same engine)
            prev = [ln for ln in waits if ln <= r["line"]]
            r["waiting"] = waits[max(prev)] if prev else None
        k = rs[-1]["num_spec_tokens"]
        if rs[-1]["log_format"] == "sglang":  # per interval: accept len is E itself, accept rate a share
            lens = [r["mean_acceptance_length"] for r in rs if r["mean_acceptance_length"] is not None]
            rates = [r["acceptance_rate"] for r in rs if r["acceptance_rate"] is not None]
            e = sum(lens) / len(lens) if lens else None
            rate = sum(rates) / len(rates) if rates else None
            loaded = [r for r in rs if (r["waiting"] or 0) > 0 and r["acceptance_rate"] is not None]
            out.append(
                {
                    "series": label,
                    "source": "log (sglang accept len / accept rate)",
                    # draft tokens verified per round ≈ accept len / accept rate (speculative_num_draft_tokens)
                    "k": round(e / rate) - 1 if e and rate else None,
                    "rounds": None,
                    "draft_tokens": None,
                    "accepted_tokens": None,
                    "acceptance_rate": rate,
                    "expected_tokens_per_round": e,
                    "joint": None,
                    "max_waiting": max((r["waiting"] or 0 for r in rs), default=None),
                    "loaded_acceptance": sum(r["acceptance_rate"] for r in loaded) / len(loaded) if loaded else None,
                    "over_time": _over_time(rs),
                    "evidence": [
                        log_evidence(
                            path,
                            r,
                            "decode line (accept len, accept rate)",
                            waiting=r["waiting"],
                            accept_len=r["mean_acceptance_length"],
                            acceptance=r["acceptance_rate"],
                        )
                        for r in (loaded or rs)[:2]
                    ],
                }
            )
            continue
        if rs[-1]["cumulative"]:  # V0: totals since start; use the latest line
            last = rs[-1]
            drafts = last["num_drafts"] or 0
            drafted, accepted = last["draft_tokens"] or 0, last["accepted_tokens"] or 0
            e = last["emitted_tokens"] / drafts if drafts and last["emitted_tokens"] is not None else None
            joint = None
        else:  # V1: per interval; weight positions by each interval's rounds
            drafts = sum(r["num_drafts"] or 0 for r in rs)
            drafted = sum(r["draft_tokens"] or 0 for r in rs)
            accepted = sum(r["accepted_tokens"] or 0 for r in rs)
            with_pos = [r for r in rs if r["per_position"] and r["num_drafts"]]
            if with_pos:
                w = sum(r["num_drafts"] for r in with_pos)
                kmax = max(len(r["per_position"]) for r in with_pos)
                joint = [
                    sum(r["per_position"][i] * r["num_drafts"] for r in with_pos if i < len(r["per_position"])) / w
                    for i in range(kmax)
                ]
                e = expected_tokens_per_round(joint)
            else:
                joint, e = None, (1 + accepted / drafts if drafts else None)
        loaded = [r for r in rs if (r["waiting"] or 0) > 0]
        out.append(
            {
                "series": label,
                "source": f"log ({rs[-1]['log_format']})",
                "k": k,
                "rounds": drafts,
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if drafted else None,
                "expected_tokens_per_round": e,
                "joint": joint,
                "max_waiting": max((r["waiting"] or 0 for r in rs), default=None),
                "loaded_acceptance": (
                    sum(r["accepted_tokens"] or 0 for r in loaded) / sum(r["draft_tokens"] or 0 for r in loaded)
                    if loaded and sum(r["draft_tokens"] or 0 for r in loaded) and not rs[-1]["cumulative"]
                    else None
                ),
                "over_time": None if rs[-1]["cumulative"] else _over_time(rs),
                "evidence": [
                    log_evidence(path, r, "spec decode line", waiting=r["waiting"], acceptance=r["acceptance_rate"])
                    for r in (loaded or rs)[:2]
                ],
            }
        )
    return out


def _over_time(rs: list[dict]) -> list[tuple[float, float, dict]] | None:
    """(time, acceptance, row) per interval line in file order: the acceptance rate, else SGLang's accept len."""
    pts = [(r["t_s"], r["acceptance_rate"], r) for r in rs if r["t_s"] is not None and r["acceptance_rate"] is not None]
    if len(pts) < 2 and any(r["mean_acceptance_length"] is not None for r in rs):
        pts = [
            (r["t_s"], r["mean_acceptance_length"], r)
            for r in rs
            if r["t_s"] is not None and r["mean_acceptance_length"] is not None
        ]
    if not pts:
        return None
    ts = spread_ties([p[0] for p in pts])
    return [(t, v, r) for t, (_, v, r) in zip(ts, pts)]


def _drift(g: dict) -> dict | None:
    """The acceptance trend of one engine's interval lines; None with fewer than MIN_TREND_POINTS lines."""
    pts = g.get("over_time")
    if not pts or len(pts) < MIN_TREND_POINTS:
        return None
    d = acceptance_drift([p[0] for p in pts], [p[1] for p in pts], SIGNIFICANCE)
    return {
        "series": g["series"],
        "n": d.trend.n,
        "window_s": round(d.window_s, 3),
        "first": pts[0][1],
        "last": pts[-1][1],
        "median": d.median,
        "S": d.trend.s,
        "p_decrease": round(d.trend.p_decrease, 6),
        "sen_slope_per_s": d.trend.sen_slope,
        "drop": round(d.drop, 4),
        "min_drop": round(DRIFT_MIN_DROP * d.median, 4),
        "decaying": d.decaying,
        "_pts": pts,
    }


def _metric_groups(ctx: Context) -> list[dict]:
    paths = input_paths(ctx)
    rows = ctx.rows(
        "SELECT input_id, engine, canonical, labels_json, max(value) AS value, max(ts_ns) AS ts_ns, min(line) AS line "
        "FROM metric_samples WHERE part = 'value' AND preferred AND canonical IN ('spec_drafts', 'spec_draft_tokens', "
        "'spec_accepted_tokens', 'spec_accepted_tokens_per_pos', 'spec_emitted_tokens') "
        "GROUP BY input_id, engine, canonical, labels_json"
    )
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["input_id"], r["engine"]), {"pos": {}, "line": r["line"], "ts_ns": r["ts_ns"]})
        if r["canonical"] == "spec_accepted_tokens_per_pos":
            pos = str(json.loads(r["labels_json"]).get("position"))
            if pos.isdigit() and len(pos) < 4 and r["value"] is not None:  # an odd label is skipped, not a crash
                g["pos"][int(pos)] = r["value"]
        else:
            g[r["canonical"]] = r["value"]
    out = []
    for (input_id, engine), g in groups.items():
        drafts, drafted, accepted = g.get("spec_drafts"), g.get("spec_draft_tokens"), g.get("spec_accepted_tokens")
        if not drafted:
            continue
        joint = [g["pos"][i] / drafts for i in sorted(g["pos"])] if drafts and g["pos"] else None
        if joint and not all(0 <= x <= 1 for x in joint):
            joint = None  # counters that are not acceptance fractions (reset, mixed engines): no per-position claim
        e = expected_tokens_per_round(joint) if joint else (1 + accepted / drafts if drafts and accepted else None)
        out.append(
            {
                "series": series_label(paths.get(input_id, "?"), engine),
                "source": "metrics counters (since process start)",
                "k": len(joint) if joint else None,
                "rounds": drafts,
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if accepted is not None else None,
                "expected_tokens_per_round": e,
                "joint": joint,
                "max_waiting": None,
                "loaded_acceptance": None,
                "over_time": None,
                "evidence": [metric_evidence(paths.get(input_id, "?"), g, "spec_decode counters", value=accepted)],
            }
        )
    return out


def check(ctx: Context) -> Check:
    groups = _log_groups(ctx) + _metric_groups(ctx)
    if not groups:
        return not_applicable(
            RULE,
            "missing speculative-decoding statistics: no SpecDecoding/Speculative metrics lines or spec_decode "
            "counters (speculative decoding off)",
        )
    table = []
    tails, loaded = [], []
    drifts = [d for d in (_drift(g) for g in groups) if d is not None]
    decays = [d for d in drifts if d["decaying"]]
    for g in groups:
        cond = conditional_acceptance(g["joint"]) if g["joint"] else None
        row = {k: v for k, v in g.items() if k not in ("evidence", "joint", "over_time")}
        dr = next((d for d in drifts if d["series"] == g["series"]), None)
        if dr is not None:
            row["acceptance_trend"] = {k: v for k, v in dr.items() if not k.startswith("_")}
        row["per_position_joint"] = [round(x, 4) for x in g["joint"]] if g["joint"] else None
        row["per_position_conditional"] = [round(x, 4) if x is not None else None for x in cond] if cond else None
        table.append(row)
        if g["joint"] and g["joint"][-1] < MIN_TAIL_YIELD:
            tails.append(g)
        la = g["loaded_acceptance"]
        if la is not None and 1 - la >= MAX_REJECTED_UNDER_LOAD:
            loaded.append(g)
    g0 = (loaded or tails or groups)[0]
    e = g0["expected_tokens_per_round"]
    values = {
        "series": g0["series"],
        "k": g0["k"],
        "rounds": g0["rounds"],
        "acceptance_rate": round(g0["acceptance_rate"], 4) if g0["acceptance_rate"] is not None else None,
        "expected_tokens_per_round": round(e, 4) if e else None,
        "break_even_round_cost": f"T_round < {e:.3f}·T_base" if e else None,
        "per_position_joint": g0["joint"],
        "per_position_conditional": conditional_acceptance(g0["joint"]) if g0["joint"] else None,
        "min_tail_yield": MIN_TAIL_YIELD,
        "max_rejected_under_load": MAX_REJECTED_UNDER_LOAD,
    }
    joint_txt = " + ".join(f"{x:.3f}" for x in g0["joint"]) if g0["joint"] else None
    substituted = (
        f"{g0['series']}: E = 1 + {joint_txt} = {e:.3f} tokens/round"
        if joint_txt and e
        else f"{g0['series']}: E = {e:.3f} tokens/round"
        if e
        else f"{g0['series']}: E unknown"
    ) + (f"; pays off only if T_round < {e:.3f}·T_base" if e else "")
    if drifts:
        values["acceptance_trends"] = len(drifts)
        values["acceptance_decays"] = len(decays)
    evidence = [ev for g in (loaded or tails or groups) for ev in g["evidence"]][: ctx.settings.max_evidence]
    if loaded:
        g = loaded[0]
        rej = 1 - g["loaded_acceptance"]
        values["rejected_share_under_load"] = round(rej, 4)
        values["max_waiting"] = g["max_waiting"]
        return finding(
            RULE,
            severity="warning",
            confidence="medium",
            impact=rej,
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Speculative decoding under load: {rej * 100:.0f} % of verified draft tokens rejected while up to "
                f"{g['max_waiting']} requests wait (E = {e:.2f} tokens/round, k = {g['k']})"
            ),
            next_check=(
                "The target model verifies every draft token, so rejected drafts take batch slots the waiting "
                "requests need: lower num_speculative_tokens or disable speculative decoding under load, and "
                "compare throughput and SCH003's queue trend with it off."
            ),
        )
    if decays and not tails:
        d = max(decays, key=lambda x: x["drop"] / (x["median"] or 1))
        pts = d["_pts"]
        values |= {k: v for k, v in d.items() if not k.startswith("_") and k != "series"} | {"series": d["series"]}
        share = d["drop"] / d["median"] if d["median"] else 1.0
        return finding(
            RULE,
            severity="warning",
            confidence="medium" if d["n"] >= 8 else "low",
            impact=min(1.0, share),
            impact_basis="the engine's median acceptance",
            formula=FORMULA + "; drift: Mann-Kendall p(S' ≤ S) < α and −Sen slope × window ≥ 10 % of the median",
            substituted=(
                f"{d['series']}: n = {d['n']}, S = {d['S']}, p = {d['p_decrease']:.4g} < {SIGNIFICANCE}, Sen slope "
                f"{d['sen_slope_per_s']:+.3g}/s × {d['window_s']:.3g} s = −{d['drop']:.3g} ≥ 0.1 × median "
                f"{d['median']:.3g}"
            ),
            values=values,
            table=table,
            evidence=[
                log_evidence(input_paths(ctx).get(r["input_id"], "?"), r, label, acceptance=v)
                for label, (_, v, r) in (("first interval", pts[0]), ("last interval", pts[-1]))
            ],
            title=(
                f"Speculative acceptance decays on {d['series']}: {d['first']:.2f} → {d['last']:.2f} over "
                f"{d['window_s']:.0f} s (Sen slope {d['sen_slope_per_s']:+.2g}/s, Mann-Kendall p = "
                f"{d['p_decrease']:.2g}): each round yields fewer tokens as the run goes on"
            ),
            next_check=(
                "Compare the traffic of the first and last intervals (prompt lengths, languages, tasks) with what the "
                "draft model was trained on, check for a weight update the draft did not get, and measure E[tokens/"
                "round] again; lower num_speculative_tokens while acceptance stays low."
            ),
        )
    if tails:
        g = tails[0]
        return finding(
            RULE,
            severity="warning",
            confidence="medium",
            impact=1 - g["joint"][-1],
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Trailing speculative position {len(g['joint'])} adds only {g['joint'][-1]:.3f} tokens per round "
                f"(E = {g['expected_tokens_per_round']:.2f}, k = {g['k']})"
            ),
            next_check=(
                "Position k costs a draft step and a verify slot every round but yields P(A1…Ak) tokens: lower "
                "num_speculative_tokens and compare T_round / E with the plain decode step time."
            ),
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
            f"Speculative decoding yields {e:.2f} tokens per round ({_k_and_rate(g0)}): it pays while a round costs "
            f"< {e:.2f} decode steps" + _steady(drifts)
            if e
            else "Speculative decoding statistics present; tokens per round unknown"
        ),
    )


def _k_and_rate(g: dict) -> str:
    parts = [f"k = {g['k']}" if g["k"] is not None else "k not logged"]
    if g["acceptance_rate"] is not None:
        parts.append(f"acceptance {g['acceptance_rate'] * 100:.0f} %")
    return ", ".join(parts)


def _steady(drifts: list[dict]) -> str:
    """'; acceptance holds over time on 2 engines' when the trend test ran and found no decay."""
    if not drifts:
        return ""
    n = len(drifts)
    return f"; no sustained decay of acceptance ({n} engine{'s' if n != 1 else ''} tested over time)"
