"""SCH007 Speculative decoding.

Hypothesis: speculative decoding emits E[tokens/round] tokens per target-model round; it pays only when a
round (draft + verify + overhead) costs less than E plain decode steps. Acceptance falls with position,
so trailing positions add little while their draft and verify work is always paid; and on a busy server
the verify work of rejected drafts takes batch capacity that waiting requests need.

Formula: per-position joint acceptance P(A1…Ai) (vLLM's "per-position acceptance rate" = accepted at
position i / drafts); conditional P(Ai | A1…Ai−1) = P(A1…Ai) / P(A1…Ai−1);
E[tokens/round] = 1 + Σ_i P(A1…Ai) (constant α: 1 + α + … + α^k; k=4, α=0.8 → 3.3616; α=0.3 → 1.43);
break-even: T_round / E < T_base, i.e. T_round < E·T_base; position k adds P(A1…Ak) tokens per round.
Findings: a round adding < 0.1 token beyond the target's own (E < 1.1: no draft accepted, SGLang's `accept len:
1.00`); a trailing position adding < 0.1 token per round; rejected drafts ≥ 50 % of verified draft
tokens while requests wait; a sustained decay of acceptance over time on one engine (Mann-Kendall one-sided
for a decrease, α = 0.05, on the per-interval acceptance in time order, same-second lines by position; the Sen
drop −slope × window must reach 10 % of the engine's median acceptance) — the draft model fits the traffic less
as it goes (a workload shift, a longer context than the draft was trained on, a weight update the draft missed).
SGLang prints per interval `accept len` = (accepted drafts + 1) per verify round, which is E itself, and `accept
rate`, whose denominator changed across versions (accept len / N of the N = speculative_num_draft_tokens verified,
root included; later (accept len − 1) / (N − 1), python/sglang/srt/managers/scheduler_metrics_mixin.py). So k and
N come from the log's `server_args=ServerArgs(...)` line when it has one (k = speculative_num_steps, the depth of an
EAGLE chain; N = speculative_num_draft_tokens; acceptance = (E − 1) / (N − 1)); only without it is k derived from
accept len / accept rate, labelled "derived", from the reading of the rate that gives one N on every line (N is
fixed for a server), and not at all when neither does. SGLang has no
per-position counts, so the trailing-position test needs vLLM's. vLLM's /metrics counters are read over the run:
their difference between the scrapes before and after it ("between scrape 1 and 2 of FILE"), the lifetime
("since server start") only for one scrape, never across a counter reset. Impact: none — rejected drafts and
a position's yield are shares of draft work, not of request time: findings rank by severity.

Evidence: V1 'SpecDecoding metrics' lines (per logging interval), V0 'Speculative metrics' lines (totals;
E = emitted / (draft tokens / k)), SGLang decode lines with `accept len`/`accept rate` (per engine: DP rank or TP
rank) and the log's server_args line, /metrics spec_decode_num_drafts / _num_draft_tokens /
_num_accepted_tokens(_per_pos) counters; Waiting
from the stats line of the same engine and time; the acceptance series per engine with its trend.

What to do: lower num_speculative_tokens to drop low-yield positions; with a queue, disable speculative
decoding or lower k (it trades throughput for single-request latency); measure T_round and T_base before
keeping it on; on a decay, compare the traffic before and after (prompt lengths, languages, tasks) and the draft
model's training data, and re-check after a weight update.
"""

from __future__ import annotations

from tracediag.analyses.serving import (
    MIN_TREND_POINTS,
    SIGNIFICANCE,
    counter_windows,
    input_paths,
    log_evidence,
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
    may_be_downstream_of=(),
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
            out.append(_sglang_group(rs, path, label, _spec_args(ctx, input_id, rs[-1].get("run"))))
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


SPEC_ARGS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def _spec_args(ctx: Context, input_id: int, run: int | None) -> dict | None:
    """SGLang's speculative settings from the log's `server_args=ServerArgs(...)` line (the server run of the
    decode lines, else the latest run before them); None when the log states none."""
    rows = ctx.rows(
        f"SELECT run, line, key, value, value_num FROM serving_startup WHERE input_id = ? AND key IN "
        f"({', '.join('?' for _ in SPEC_ARGS)}) ORDER BY run, line",
        [input_id, *SPEC_ARGS],
    )
    by_run: dict = {}
    for r in rows:
        by_run.setdefault(r["run"], {}).setdefault(r["key"], r)
    earlier = [k for k in by_run if k is not None and run is not None and k <= run]
    if not by_run:
        return None
    args = by_run[max(earlier)] if earlier else next(iter(by_run.values()))

    def num(key: str) -> int | None:
        v = (args.get(key) or {}).get("value_num")
        return int(v) if v is not None and v == v and abs(v) < 1e6 else None

    algo = (args.get("speculative_algorithm") or {}).get("value")
    out = {
        "algorithm": None if algo in (None, "None") else algo,
        "num_steps": num("speculative_num_steps"),
        "eagle_topk": num("speculative_eagle_topk"),
        "num_draft_tokens": num("speculative_num_draft_tokens"),
        "line": min(r["line"] for r in args.values()),
    }
    return out if out["algorithm"] or out["num_steps"] or out["num_draft_tokens"] else None


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _reading(pairs: list[tuple[float, float]], minus: float) -> int | None:
    """N (or N − 1) when (accept len − minus) / accept rate is the same integer on every line, within the rounding
    of the two printed decimals; None when the ratio moves from line to line (the wrong reading of the rate)."""
    ratios = [((e - minus) / r, r) for e, r in pairs if r > 0]
    if not ratios:
        return None
    n = round(sorted(x for x, _ in ratios)[len(ratios) // 2])
    ok = all(abs(x - n) <= 0.01 * (1 + x) / r + 0.05 for x, r in ratios)  # ±0.005 on each printed value
    return n if ok and n >= 1 else None


def _derived_k(rs: list[dict]) -> tuple[int | None, str, int | None]:
    """k from accept len / accept rate when the log states no server_args. The rate's denominator changed in
    SGLang: N = speculative_num_draft_tokens verified per round, root included (rate = accept len / N), later the
    N − 1 drafts ((accept len − 1) / (N − 1)). N is fixed for a server, so the reading that gives one integer on
    every line is the log's; k = N − 1 (the draft depth only for a chain, topk = 1). (k, where k came from, N)."""
    pairs = [(r["mean_acceptance_length"], r["acceptance_rate"]) for r in rs]
    pairs = [(e, a) for e, a in pairs if e is not None and a]
    if not pairs:
        return None, "not logged (no server_args line, no accept rate)", None
    older, newer = _reading(pairs, 0.0), _reading(pairs, 1.0)
    k_old, k_new = (older - 1 if older else None), newer
    if k_old is not None and (k_new is None or k_new == k_old):
        why = (
            f"derived: accept len / accept rate = {older} draft tokens verified per round on all {len(pairs)} lines "
            "(SGLang's older accept rate), k = N − 1; no server_args line"
        )
        return k_old, why, older
    if k_new is not None and k_old is None:
        why = (
            f"derived: (accept len − 1) / accept rate = {newer} drafts per round on all {len(pairs)} lines (SGLang's "
            "newer accept rate); no server_args line"
        )
        return k_new, why, newer + 1
    why = (
        "not derivable: accept len / accept rate is not one draft count on every line under either of SGLang's "
        "readings of the accept rate (no server_args line to say k)"
    )
    return None, why, None


def _sglang_group(rs: list[dict], path: str, label: str, args: dict | None) -> dict:
    """One SGLang engine's decode lines: E = accept len (per interval, averaged); k and the draft tokens verified
    per round from server_args (speculative_num_steps: k of an EAGLE chain; speculative_num_draft_tokens: tokens
    verified per round, the root included), derived from accept len / accept rate only when the log has none."""
    e = _mean([r["mean_acceptance_length"] for r in rs])
    rate = _mean([r["acceptance_rate"] for r in rs])
    waiting = [r for r in rs if (r["waiting"] or 0) > 0]
    if args and (args["num_steps"] or args["num_draft_tokens"]):
        n_draft = args["num_draft_tokens"] or (args["num_steps"] + 1)
        k = args["num_steps"] if args["num_steps"] is not None else n_draft - 1
        which = "speculative_num_steps" if args["num_steps"] is not None else "speculative_num_draft_tokens − 1"
        k_source = f"server_args {which} (line {args['line']})"
        n_from = "server_args"
    else:
        k, k_source, n_draft = _derived_k(rs)
        n_from = "the derived N"

    def acc(x):  # accepted drafts per draft token verified (the root, always kept, left out)
        return (x - 1) / (n_draft - 1) if x is not None and n_draft and n_draft > 1 else None

    if n_draft and n_draft > 1:
        acceptance = acc(e)
        loaded_acc = _mean([acc(r["mean_acceptance_length"]) for r in waiting])
        acc_source = (
            f"(accept len − 1) / (N − 1) = ({e:.3f} − 1) / ({n_draft} − 1), N from {n_from} (the logged accept "
            "rate's denominator changed across SGLang versions)"
            if acceptance is not None
            else None
        )
    else:
        acceptance = rate
        loaded_acc = _mean([r["acceptance_rate"] for r in waiting])
        acc_source = "logged accept rate (N unknown)" if rate is not None else None
    loaded = [r for r in waiting if r["mean_acceptance_length"] is not None] if loaded_acc is not None else []
    return {
        "series": label,
        "source": "log (sglang accept len / accept rate" + (", server_args)" if args else ")"),
        "k": k,
        "k_source": k_source,
        "speculative_algorithm": (args or {}).get("algorithm"),
        "speculative_eagle_topk": (args or {}).get("eagle_topk"),
        "draft_tokens_verified_per_round": n_draft,
        "rounds": None,
        "draft_tokens": None,
        "accepted_tokens": None,
        "acceptance_rate": acceptance,
        "acceptance_source": acc_source,
        "acceptance_rate_logged": rate,
        "expected_tokens_per_round": e,
        "joint": None,
        "max_waiting": max((r["waiting"] or 0 for r in rs), default=None),
        "loaded_acceptance": loaded_acc,
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


def _metric_groups(ctx: Context) -> tuple[list[dict], list[str]]:
    """vLLM's spec_decode counters per /metrics series over its window (counter_windows: the difference between
    scrapes; the lifetime, since server start, for one scrape), and why a series gave none."""
    out, skipped = [], []
    for w in counter_windows(ctx):
        if not w.has("spec_draft_tokens"):
            continue
        drafted = w.total("spec_draft_tokens") or 0.0
        if w.broken or drafted <= 0:
            skipped.append(f"{w.series}: " + (w.basis if w.broken else f"no draft token {w.basis}"))
            continue
        drafts, accepted = w.total("spec_drafts"), w.total("spec_accepted_tokens")
        pos = {
            int(k): v for k, v in w.by_label("spec_accepted_tokens_per_pos", "position").items()
            if k.isdigit() and len(k) < 4  # an odd label is skipped, not a crash
        }  # fmt: skip
        joint = [pos[i] / drafts for i in sorted(pos)] if drafts and pos else None
        if joint and not all(0 <= x <= 1 for x in joint):
            joint = None  # counters that are not acceptance fractions (reset, mixed engines): no per-position claim
        e = expected_tokens_per_round(joint) if joint else (1 + accepted / drafts if drafts and accepted else None)
        out.append(
            {
                "series": w.series,
                "source": f"metrics counters, {w.basis}",
                "window": w.basis,
                "k": len(joint) if joint else None,
                "k_source": "number of per-position counters" if joint else "not in the counters",
                "rounds": drafts,
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if accepted is not None else None,
                "expected_tokens_per_round": e,
                "joint": joint,
                "max_waiting": None,
                "loaded_acceptance": None,
                "over_time": None,
                "evidence": w.evidence("spec_decode counters", accepted=accepted, drafts=drafts),
            }
        )
    return out, skipped


IMPACT_BASIS = (
    "none: rejected drafts, a trailing position's yield and a drop in acceptance are shares of draft work, not of "
    "request time or of requests (T_round and T_base are not measured here): ranked by severity"
)


def _missing(ctx: Context, skipped: list[str]) -> str:
    """The not-applicable reason: what is missing, with the speculative settings a log states when it has them."""
    if skipped:
        return "missing speculative-decoding statistics of the run: " + "; ".join(skipped)
    said = ""
    for iid in sorted(input_paths(ctx)):
        args = _spec_args(ctx, iid, None)
        if args:
            said = (
                f"; server_args (line {args['line']}) says speculative_algorithm {args['algorithm']}, "
                f"speculative_num_steps {args['num_steps']}, speculative_eagle_topk {args['eagle_topk']}, "
                f"speculative_num_draft_tokens {args['num_draft_tokens']}, but no decode line with `accept len` was "
                "logged (a request shorter than --decode-log-interval decode steps logs none)"
            )
            break
    return (
        "missing speculative-decoding statistics: no SpecDecoding/Speculative metrics lines or spec_decode "
        "counters" + (said or " (speculative decoding off)")
    )


def _table(groups: list[dict], drifts: list[dict]) -> list[dict]:
    table = []
    for g in groups:
        cond = conditional_acceptance(g["joint"]) if g["joint"] else None
        row = {k: v for k, v in g.items() if k not in ("evidence", "joint", "over_time")}
        dr = next((d for d in drifts if d["series"] == g["series"]), None)
        if dr is not None:
            row["acceptance_trend"] = {k: v for k, v in dr.items() if not k.startswith("_")}
        row["per_position_joint"] = [round(x, 4) for x in g["joint"]] if g["joint"] else None
        row["per_position_conditional"] = [round(x, 4) if x is not None else None for x in cond] if cond else None
        table.append(row)
    return table


def _values(g0: dict) -> tuple[dict, str]:
    """The values and the substituted formula of the group the finding is about."""
    e = g0["expected_tokens_per_round"]
    values = {
        "series": g0["series"],
        "window": g0.get("window"),
        "k": g0["k"],
        "k_source": g0.get("k_source"),
        "rounds": g0["rounds"],
        "acceptance_rate": round(g0["acceptance_rate"], 4) if g0["acceptance_rate"] is not None else None,
        "expected_tokens_per_round": round(e, 4) if e else None,
        "break_even_round_cost": f"T_round < {e:.3f}·T_base" if e else None,
        "per_position_joint": g0["joint"],
        "per_position_conditional": conditional_acceptance(g0["joint"]) if g0["joint"] else None,
        "min_tail_yield": MIN_TAIL_YIELD,
        "max_rejected_under_load": MAX_REJECTED_UNDER_LOAD,
        "impact_basis": IMPACT_BASIS,
    }
    for key in ("speculative_algorithm", "speculative_eagle_topk", "draft_tokens_verified_per_round",
                "acceptance_source", "acceptance_rate_logged"):  # fmt: skip
        if g0.get(key) is not None:
            values[key] = g0[key]
    joint_txt = " + ".join(f"{x:.3f}" for x in g0["joint"]) if g0["joint"] else None
    substituted = (
        f"{g0['series']}: E = 1 + {joint_txt} = {e:.3f} tokens/round"
        if joint_txt and e
        else f"{g0['series']}: E = {e:.3f} tokens/round"
        if e
        else f"{g0['series']}: E unknown"
    ) + (f"; pays off only if T_round < {e:.3f}·T_base" if e else "")
    if g0.get("acceptance_source"):
        substituted += f"; acceptance = {g0['acceptance_source']}"
    if g0.get("window"):
        substituted += f" ({g0['window']})"
    return values, substituted


def _loaded_finding(g: dict, e: float, substituted: str, values: dict, table: list, evidence: list) -> Check:
    """Drafts rejected while requests wait: the rejected tokens took batch slots the queue needed."""
    rej = 1 - g["loaded_acceptance"]
    values["rejected_share_under_load"] = round(rej, 4)
    values["max_waiting"] = g["max_waiting"]
    return finding(
        RULE,
        severity="warning",
        confidence="medium",
        impact=None,  # IMPACT_BASIS
        formula=FORMULA,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        title=(
            f"Speculative decoding under load: {rej * 100:.0f} % of verified draft tokens rejected while up to "
            f"{g['max_waiting']} requests wait (E = {e:.2f} tokens/round, {_k_text(g)})"
        ),
        next_check=(
            "The target model verifies every draft token, so rejected drafts take batch slots the waiting "
            "requests need: lower num_speculative_tokens or disable speculative decoding under load, and "
            "compare throughput and SCH003's queue trend with it off."
        ),
    )


def _decay_finding(ctx: Context, d: dict, values: dict, table: list) -> Check:
    """The acceptance trend `d` (the largest drop against its median) falls significantly over the run."""
    pts = d["_pts"]
    values |= {k: v for k, v in d.items() if not k.startswith("_") and k != "series"} | {"series": d["series"]}
    values["drop_share_of_median"] = round(d["drop"] / d["median"], 4) if d["median"] else None
    return finding(
        RULE,
        severity="warning",
        confidence="medium" if d["n"] >= 8 else "low",
        impact=None,  # IMPACT_BASIS; the drop is the share `drop_share_of_median`
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


def check(ctx: Context) -> Check:
    metric_groups, skipped = _metric_groups(ctx)
    groups = _log_groups(ctx) + metric_groups
    if not groups:
        return not_applicable(RULE, _missing(ctx, skipped))
    tails, loaded = [], []
    drifts = [d for d in (_drift(g) for g in groups) if d is not None]
    decays = [d for d in drifts if d["decaying"]]
    table = _table(groups, drifts)
    for g in groups:
        if g["joint"] and g["joint"][-1] < MIN_TAIL_YIELD:
            tails.append(g)
        la = g["loaded_acceptance"]
        if la is not None and 1 - la >= MAX_REJECTED_UNDER_LOAD:
            loaded.append(g)
    # a round whose drafts add almost nothing: E = accept len ≈ 1 (SGLang prints 1.00 when no draft is accepted)
    useless = [g for g in groups if g["expected_tokens_per_round"] is not None
               and g["expected_tokens_per_round"] < 1 + MIN_TAIL_YIELD]  # fmt: skip
    g0 = (loaded or useless or tails or groups)[0]
    e = g0["expected_tokens_per_round"]
    values, substituted = _values(g0)
    if skipped:
        values["series_without_a_window"] = skipped
    if drifts:
        values["acceptance_trends"] = len(drifts)
        values["acceptance_decays"] = len(decays)
    evidence = [ev for g in (loaded or useless or tails or groups) for ev in g["evidence"]][: ctx.settings.max_evidence]
    if loaded:
        return _loaded_finding(loaded[0], e, substituted, values, table, evidence)
    if useless:
        g = useless[0]
        return finding(
            RULE,
            severity="warning",
            confidence="medium",
            impact=None,  # IMPACT_BASIS
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Speculative decoding yields {e:.2f} tokens per round on {g['series']} ({_k_text(g)}): the drafts "
                f"add less than {MIN_TAIL_YIELD:g} token a round, so every round pays the draft and the verification "
                "for almost nothing"
            ),
            next_check=(
                "Check that the draft model matches the target (its vocabulary, its version, the chat template) and "
                "that speculative decoding is configured as intended; with acceptance this low, turn it off and "
                "compare the decode step time (TPOT) with it on and off."
            ),
        )
    if decays and not tails:
        return _decay_finding(ctx, max(decays, key=lambda x: x["drop"] / (x["median"] or 1)), values, table)
    if tails:
        g = tails[0]
        return finding(
            RULE,
            severity="warning",
            confidence="medium",
            impact=None,  # IMPACT_BASIS
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Trailing speculative position {len(g['joint'])} adds only {g['joint'][-1]:.3f} tokens per round "
                f"(E = {g['expected_tokens_per_round']:.2f}, {_k_text(g)}"
                + (f", {g['window']})" if g.get("window") else ")")
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


def _k_text(g: dict) -> str:
    """'k = 3 (server_args)', 'k = 5 (derived)', 'k = 3', 'k not logged'."""
    if g["k"] is None:
        return "k not logged" if not str(g.get("k_source") or "").startswith("not derivable") else "k unknown"
    src = str(g.get("k_source") or "")
    tag = " (server_args)" if src.startswith("server_args") else " (derived)" if src.startswith("derived") else ""
    return f"k = {g['k']}{tag}"


def _k_and_rate(g: dict) -> str:
    parts = [_k_text(g)]
    if g["acceptance_rate"] is not None:
        parts.append(f"acceptance {g['acceptance_rate'] * 100:.0f} %")
    if g.get("window"):
        parts.append(g["window"])
    return ", ".join(parts)


def _steady(drifts: list[dict]) -> str:
    """'; acceptance holds over time on 2 engines' when the trend test ran and found no decay."""
    if not drifts:
        return ""
    n = len(drifts)
    return f"; no sustained decay of acceptance ({n} engine{'s' if n != 1 else ''} tested over time)"
