"""SCH013 Engine imbalance.

Hypothesis: data-parallel engines behind one endpoint (vLLM `--data-parallel-size`, SGLang `--dp`) should carry
about the same load and deliver about the same throughput; when one lags, the fleet's capacity is set by the
slowest queue, and adding replicas does not fix it. Two causes look alike from the client and call for different
fixes: the router sends the engines uneven work (waiting, or running, differs), or one engine is slow at even load
(same queue, lower throughput per running request: a degraded GPU, a straggler rank, thermal or PCIe trouble, a
different configuration).

Formula: per engine over the window, mean generation throughput tput_e (vLLM stats lines `Engine 00N: … Avg
generation throughput`, SGLang decode lines of rank DPn `gen throughput (token/s)`; /metrics: sglang:gen_throughput
per dp_rank, or Δ vllm:generation_tokens / Δt per `engine` between the first and last timed scrape), mean Running,
Waiting and KV usage. Lagging engine: the lowest tput_e; it lags when tput_lag < 0.8 · max tput_e. Capacity lost =
1 − Σ tput_e / (n · max tput_e), the share the fleet would gain if every engine matched the fastest (an upper
estimate: the fastest may have had the most work). Waiting is uneven when its spread across engines exceeds
max(1, 25 % of the largest); running likewise. Uneven waiting → router imbalance; even waiting, fewer running on
the lagging engine → the router gives it less work (under-loaded, not slow); even waiting and running, lower
throughput → a slow engine. With Running missing the two cannot be told apart, and the finding says so.

Evidence: the per-engine table (samples, window, mean throughput, running, waiting, KV usage, throughput per
running request), the lagging and the fastest engine's samples.

What to do: router imbalance → the router's policy (round robin vs least-load vs cache-aware), request sizes,
prefix-affinity hot spots; a slow engine → compare it with its peers: GPU clocks, Xid errors, NVLink/PCIe links,
its TP ranks' skew (COL005), its KV cache size (SCH005), the flags it started with.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

from tracediag.analyses.serving import Series, log_series, metric_series, series_evidence, short
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import capacity_lost

RULE = RuleMeta(
    id="SCH013",
    step=6,
    title="Data-parallel engines share the load and deliver alike",
    may_be_downstream_of=("SCH011",),
    enabled_by=("--log", "--metrics"),
)
LAG_RATIO = 0.8  # an engine lags below this share of the fastest engine's throughput
MIN_LOST = 0.05  # ... and the fleet must lose at least this share of its capacity
UNEVEN_SHARE = 0.25  # waiting or running spread above this share of the largest (and above 1 request) is uneven
FORMULA = (
    "lag: tput_lag < 0.8·max tput_e; capacity lost = 1 − Σ tput_e / (n·max tput_e); uneven waiting → router, "
    "even waiting and running with lower tput → slow engine"
)


def _mean(a: Any) -> float | None:
    if a is None:
        return None
    v = np.asarray(a, dtype=float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else None


def _engine_key(label: Any) -> Any:
    """A metrics engine label as a data-parallel engine: vLLM's `engine` index, SGLang's dp rank; None for labels
    that name only tensor/pipeline ranks of one engine (they report the same scheduler)."""
    if label is None:
        return None
    s = str(label)
    m = re.search(r"(?:^|/)dp(\d+)", s)
    if m:
        return f"dp{m[1]}"
    return s if s.isdigit() else None


def _from_logs(ctx: Context) -> dict[tuple, dict[Any, dict]]:
    """(input, run) -> engine -> per-engine means from the stats lines (engine = DP rank / `Engine 00N`)."""
    groups: dict[tuple, dict[Any, dict]] = defaultdict(dict)
    # an SGLang row's engine is its TP rank when the prefix has no DP tag: the ranks of one engine, not engines
    tp_only = {
        (r["input_id"], r["engine"])
        for r in ctx.rows(
            "SELECT DISTINCT input_id, engine, process FROM serving_stats WHERE log_format LIKE 'sglang%' "
            "AND engine IS NOT NULL"
        )
        if not re.search(r"(?<![A-Z_])DP\d+", r["process"] or "")
    }
    for s in log_series(ctx, "gen_tput_tok_s", ("running", "waiting", "kv_usage_pct")):
        if s.engine is None or len(s) == 0 or (s.input_id, s.engine) in tp_only:
            continue
        key = (s.input_id, s.run, s.path)
        sglang = str(s.point(0)["log_format"]).startswith("sglang")  # SGLang's engine here is its DP rank
        eng = int(s.engine) if isinstance(s.engine, (int, np.integer)) else s.engine  # a numpy scalar is not JSON
        e = groups[key].setdefault(f"dp{eng}" if sglang else eng, {"series": [], "samples": 0})
        e["series"].append(s)
    out: dict[tuple, dict[Any, dict]] = {}
    for key, engines in groups.items():
        rows = {}
        for eng, e in engines.items():
            cols = {c: np.concatenate([s.cols[c].astype(float) for s in e["series"]]) for c in
                    ("value", "running", "waiting", "kv_usage_pct", "t_s")}  # fmt: skip
            tput = cols["value"][~np.isnan(cols["value"])]
            rows[eng] = {
                "samples": len(tput),
                "tput_tok_s": float(tput.mean()) if len(tput) else None,
                "running": _mean(cols["running"]),
                "waiting": _mean(cols["waiting"]),
                "kv_usage_pct": _mean(cols["kv_usage_pct"]),
                "window_s": float(np.nanmax(cols["t_s"]) - np.nanmin(cols["t_s"])) if len(cols["t_s"]) else None,
                "_s": e["series"][0],
            }
        out[key] = rows
    return out


def _rate(s: Series) -> float | None:
    """Δ counter / Δt between the first and last timed scrape of a counter series."""
    idx = s.valid()
    if len(idx) < 2:
        return None
    t, v = s.t.astype(float)[idx], s.v.astype(float)[idx]
    dt = t[-1] - t[0]
    return float((v[-1] - v[0]) / dt) if dt > 0 and v[-1] >= v[0] else None


def _from_metrics(ctx: Context) -> dict[tuple, dict[Any, dict]]:
    by_file: dict[tuple, dict[Any, dict]] = defaultdict(dict)
    gauges = {"running": "requests_running", "waiting": "requests_waiting", "kv_usage_pct": "kv_usage"}
    for s in metric_series(ctx, "gen_tput_tok_s"):
        eng = _engine_key(s.engine)
        if eng is not None and len(s):
            row = by_file[(s.input_id, None, s.path)].setdefault(eng, {"_s": s})
            row["tput_tok_s"], row["samples"] = _mean(s.v), len(s)
    for s in metric_series(ctx, "generation_tokens"):
        eng = _engine_key(s.engine)
        r = _rate(s) if eng is not None else None
        if r is not None:
            row = by_file[(s.input_id, None, s.path)].setdefault(eng, {"_s": s})
            row.setdefault("tput_tok_s", r)
            row.setdefault("samples", len(s))
    for col, canonical in gauges.items():
        for s in metric_series(ctx, canonical):
            eng = _engine_key(s.engine)
            if eng is None:
                continue
            row = by_file[(s.input_id, None, s.path)].setdefault(eng, {"_s": s})
            m = _mean(s.v)
            row[col] = m * 100 if col == "kv_usage_pct" and m is not None else m
    return by_file


def _uneven(values: list[float]) -> bool:
    if len(values) < 2:
        return False
    hi, lo = max(values), min(values)
    return hi - lo > max(1.0, UNEVEN_SHARE * hi)


def _judge(engines: dict[Any, dict]) -> dict[str, Any] | None:
    """The comparison of one group of engines; None with fewer than two measured engines."""
    measured = {e: r for e, r in engines.items() if r.get("tput_tok_s") is not None and not math.isnan(r["tput_tok_s"])}
    if len(measured) < 2 or max(r["tput_tok_s"] for r in measured.values()) <= 0:
        return None
    lag = min(measured, key=lambda e: measured[e]["tput_tok_s"])
    top = max(measured, key=lambda e: measured[e]["tput_tok_s"])
    ratio = measured[lag]["tput_tok_s"] / measured[top]["tput_tok_s"]
    lost = capacity_lost([r["tput_tok_s"] for r in measured.values()])
    waiting = [r["waiting"] for r in measured.values() if r.get("waiting") is not None]
    running = [r["running"] for r in measured.values() if r.get("running") is not None]
    w_uneven, r_uneven = _uneven(waiting), _uneven(running)
    lag_r, top_r = measured[lag].get("running"), measured[top].get("running")
    if w_uneven:
        cause = "router"
        why = (
            f"waiting differs across engines ({min(waiting):.3g}–{max(waiting):.3g}): the router spreads work unevenly"
        )
    elif lag_r is not None and top_r is not None and (r_uneven and lag_r < LAG_RATIO * top_r):
        cause = "router"
        why = (
            f"waiting even ({_range(waiting)}) but {short_engine(lag)} runs {lag_r:.3g} requests against "
            f"{top_r:.3g} on {short_engine(top)}: the router gives it less work (under-loaded, not slow)"
        )
    elif lag_r is not None and top_r is not None:
        cause = "slow engine"
        why = (
            f"waiting ({_range(waiting)}) and running ({_range(running)}) even, yet {short_engine(lag)} generates "
            f"{ratio:.0%} of {short_engine(top)}'s rate: the engine itself is slow"
        )
    else:
        cause = "slow engine or lighter load"
        why = (
            f"waiting {'even (' + _range(waiting) + ')' if waiting else 'not reported'}, running per engine not in "
            "these inputs: a slow engine cannot be told from one the router gives less work"
        )
    return {
        "lagging": lag,
        "fastest": top,
        "ratio": ratio,
        "capacity_lost": lost,
        "cause": cause,
        "why": why,
        "engines": len(measured),
        "waiting_known": len(waiting),
        "running_known": len(running),
        "lags": ratio < LAG_RATIO and lost >= MIN_LOST,
        "_measured": measured,
    }


def short_engine(e: Any) -> str:
    """'DP3' for SGLang's data-parallel ranks, 'engine 2' for vLLM's engine index."""
    return f"DP{str(e)[2:]}" if str(e).startswith("dp") else f"engine {e}"


def _range(xs: list[float]) -> str:
    return "—" if not xs else f"{min(xs):.3g}" if max(xs) == min(xs) else f"{min(xs):.3g}–{max(xs):.3g}"


def _r(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def check(ctx: Context) -> Check:
    groups = _from_logs(ctx) | _from_metrics(ctx)
    judged = [(key, engines, _judge(engines)) for key, engines in groups.items()]
    judged = [x for x in judged if x[2] is not None]
    if not judged:
        return not_applicable(
            RULE,
            "missing a second data-parallel engine: no stats lines or scrapes of two or more engines (vLLM "
            "`Engine 00N` / `engine` label, SGLang `DPn` prefixes / dp_rank label) with their throughput",
        )
    table = []
    for (_, run, path), _, j in judged:
        for e, r in sorted(j["_measured"].items(), key=lambda kv: str(kv[0])):
            per_req = r["tput_tok_s"] / r["running"] if r.get("running") else None
            table.append(
                {
                    "input": short(path),
                    "run": run,
                    "engine": e,
                    "samples": r.get("samples"),
                    "tput_tok_s": _r(r["tput_tok_s"]),
                    "running_mean": _r(r.get("running")),
                    "waiting_mean": _r(r.get("waiting")),
                    "kv_usage_mean_pct": _r(r.get("kv_usage_pct")),
                    "tput_per_running_tok_s": _r(per_req),
                    "share_of_fastest": _r(r["tput_tok_s"] / j["_measured"][j["fastest"]]["tput_tok_s"]),
                }
            )
    key, _, j = max(judged, key=lambda x: (x[2]["lags"], x[2]["capacity_lost"]))
    m = j["_measured"]
    lag, top = j["lagging"], j["fastest"]
    values = {k: _r(v) for k, v in j.items() if not k.startswith("_") and k not in ("why",)} | {
        "input": short(key[2]),
        "lagging_tput_tok_s": _r(m[lag]["tput_tok_s"]),
        "fastest_tput_tok_s": _r(m[top]["tput_tok_s"]),
        "lag_ratio_threshold": LAG_RATIO,
        "min_capacity_lost": MIN_LOST,
    }
    tputs = [m[e]["tput_tok_s"] for e in sorted(m, key=str)]
    substituted = (
        f"{short(key[2])}: lost = 1 − ({' + '.join(f'{x:.4g}' for x in tputs)}) / ({len(tputs)} × "
        f"{m[top]['tput_tok_s']:.4g}) = {j['capacity_lost']:.3f}; {short_engine(lag)} / {short_engine(top)} = "
        f"{m[lag]['tput_tok_s']:.4g} / {m[top]['tput_tok_s']:.4g} = {j['ratio']:.3f}"
    )
    evidence = [
        series_evidence(m[e]["_s"], m[e]["_s"].point(0), label, tput_tok_s=_r(m[e]["tput_tok_s"]), engine=str(e))
        for label, e in (("lagging engine", lag), ("fastest engine", top))
    ]
    common = {"formula": FORMULA, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    if not j["lags"]:
        return passed(
            RULE,
            confidence="medium" if j["engines"] >= 2 else "low",
            **common,
            title=(
                f"{j['engines']} data-parallel engines deliver alike: the slowest ({short_engine(lag)}) at "
                f"{j['ratio']:.0%} of the fastest, {j['capacity_lost']:.1%} of capacity lost"
            ),
        )
    router = j["cause"] == "router"
    return finding(
        RULE,
        severity="warning",
        confidence="medium" if j["cause"] != "slow engine or lighter load" else "low",
        impact=j["capacity_lost"],
        impact_basis="the data-parallel engines' combined throughput",
        **common,
        title=(
            f"{short_engine(lag)[0].upper()}{short_engine(lag)[1:]} lags: {m[lag]['tput_tok_s']:.4g} tok/s against "
            f"{m[top]['tput_tok_s']:.4g} on {short_engine(top)} ({j['ratio']:.0%}); {j['capacity_lost']:.0%} of "
            f"the {j['engines']} engines' capacity lost — {j['why']}"
        ),
        next_check=(
            "Router imbalance: check the router's policy (round robin, least load, cache-aware), request sizes and "
            "prefix-affinity hot spots, and compare per-engine Waiting over time."
            if router
            else "Compare the lagging engine with its peers: GPU clocks and Xid errors, NVLink/PCIe links, its TP "
            "ranks' skew (COL005), its KV cache size (SCH005) and start-up flags; with Running per engine "
            "(scrape num_requests_running / sglang:num_running_reqs) router and slow engine can be told apart."
        ),
    )
