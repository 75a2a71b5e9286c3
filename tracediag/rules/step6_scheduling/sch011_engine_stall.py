"""SCH011 Engine stall.

Hypothesis: the most common serving incident is an engine that stops making progress while requests are in it
— a hung collective, a dead worker, a scheduler deadlock. Requests are running or waiting, yet no tokens come
out; the HTTP front end keeps answering /health and /metrics (a 200 proves nothing), so dashboards stay green.
An engine with no requests that logs nothing is idle, not stalled.

Formula: (a) stuck samples: k ≥ 3 consecutive stats samples (log lines or scrapes) of one server run with
Running + Waiting > 0 and generation throughput < max(0.5 tok/s, 1 % of the run's median non-zero rate)
(the 2023 `Throughput` counts prompt and generation together; a sample with prompt throughput above the floor
is progress); window = t_last − t_first of the samples. (b) silence: the run's last stats line had
Running + Waiting > 0, then no stats line for ≥ 6 logging intervals (median spacing of the run's lines, at
least 10 s) while later lines with their own times keep arriving, and no later line shows a request finishing.
vLLM ≥ 0.8.5 logs an all-zero-throughput line at DEBUG, so silence after a line with work in it is what a
hang looks like at INFO; a file that simply ends is not a silence. (c) dead engine: the engine's own
death messages (EngineDeadError, "Engine loop has died", "MQLLMEngine is already dead", worker died, NCCL
watchdog timeout, SGLang watchdog timeout). Severity: error with a death message or a stall ≥ 5 minutes,
else warning; a shared-memory broadcast wait alone (also printed during long compilations) is info.

Evidence: the window (first and last stuck sample, its length), Running/Waiting/throughput at its start, the
log lines just before it and the hang or death messages inside or after it.

What to do: check worker health and the engine's dead-process messages (EngineDeadError, worker died, NCCL
watchdog timeouts — NCCL_DEBUG=INFO, TORCH_NCCL_ASYNC_ERROR_HANDLING), py-spy dump the engine and worker
processes, check GPU health (nvidia-smi, Xid errors); restart the replica and add a liveness probe on
generation progress (tokens per interval with requests in flight), not on /health.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracediag.analyses.serving import Series, input_paths, log_evidence, log_series, metric_series, series_evidence
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SCH011",
    step=6,
    title="The engine makes progress whenever requests are in it",
    enabled_by=("--log", "--metrics"),
)
K = 3  # consecutive stuck samples
FLOOR_TOK_S = 0.5
FLOOR_SHARE = 0.01
SILENT_INTERVALS = 6
MIN_INTERVAL_S = 10.0
STALL_COLUMNS = ("waiting", "gen_tput_tok_s", "prompt_tput_tok_s", "tput_tok_s")  # what a stuck sample is judged on
LONG_S = 300.0
DEATH = ("engine_dead", "worker_died", "nccl_watchdog", "watchdog_timeout", "scheduler_exception")
FORMULA = (
    "stall: ≥ 3 consecutive samples with Running + Waiting > 0 and generation < max(0.5 tok/s, 1 % of median); "
    "silence: no stats line for ≥ 6 intervals after one with work, while other lines arrive"
)


def _stuck_windows(s: Series) -> tuple[list[tuple[int, int]], float, bool]:
    """(first, last) index ranges of ≥ K consecutive stuck samples; the floor used; whether the series had work."""
    c = s.cols
    work = np.nan_to_num(c["value"].astype(float)) + np.nan_to_num(c["waiting"].astype(float))  # value = Running
    gen = c["gen_tput_tok_s"].astype(float)
    old = c["tput_tok_s"].astype(float)  # 2023 combined throughput
    prompt = np.nan_to_num(c["prompt_tput_tok_s"].astype(float))
    rate = np.where(np.isnan(gen), old, gen)
    nonzero = rate[(rate > 0) & ~np.isnan(rate)]
    floor = max(FLOOR_TOK_S, FLOOR_SHARE * float(np.median(nonzero))) if len(nonzero) else FLOOR_TOK_S
    stuck = (work > 0) & ~np.isnan(rate) & (rate < floor) & (prompt < floor)
    out, start = [], None
    for i, st in enumerate([*stuck.tolist(), False]):
        if st and start is None:
            start = i
        elif not st and start is not None:
            if i - start >= K:
                out.append((start, i - 1))
            start = None
    return out, floor, bool((work > 0).any())


def _metric_stalls(ctx: Context) -> list[dict]:
    """Scrapes: requests running/waiting while the generation-token counter does not move."""
    out = []
    gen = {(s.input_id, s.engine): s for s in metric_series(ctx, "generation_tokens")}
    waiting = {(s.input_id, s.engine): s for s in metric_series(ctx, "requests_waiting")}
    for s in metric_series(ctx, "requests_running"):
        g = gen.get((s.input_id, s.engine))
        if g is None or len(g) != len(s) or len(s) < K + 1:
            continue
        w = waiting.get((s.input_id, s.engine))
        work = np.nan_to_num(s.v.astype(float)) + (np.nan_to_num(w.v.astype(float)) if w and len(w) == len(s) else 0)
        t = s.t.astype(float)
        dt = np.diff(t)
        rate = np.diff(np.nan_to_num(g.v.astype(float))) / np.where(dt > 0, dt, np.nan)
        stuck = (work[1:] > 0) & (rate < FLOOR_TOK_S)
        run = 0
        for i, st in enumerate([*stuck.tolist(), False]):
            if st:
                run += 1
                continue
            if run >= K:
                a, b = i - run + 1, i
                out.append(
                    {
                        "series": s.label,
                        "source": "metrics",
                        "first": s.point(a - 1),
                        "last": s.point(b),
                        "samples": run,
                        "window_s": float(t[b] - t[a - 1]),
                        "work": int(work[a]),
                        "s": s,
                    }
                )
            run = 0
    return out


def _log_stalls(s: Series, wins: list[tuple[int, int]], floor: float) -> list[dict]:
    t = s.t.astype(float)
    return [
        {
            "series": s.label,
            "source": "log",
            "first": s.point(a),
            "last": s.point(b),
            "samples": b - a + 1,
            "window_s": float(t[b] - t[a]) if not np.isnan(t[b] - t[a]) else None,
            "work": int(np.nan_to_num(s.cols["value"][a]) + np.nan_to_num(s.cols["waiting"][a])),
            "floor": floor,
            "s": s,
        }
        for a, b in wins
    ]


def _silence(s: Series, events: list[dict]) -> dict | None:
    """The stats lines stopping while other lines keep arriving, after a last line that still had work in it."""
    t = s.t.astype(float)
    last = s.point(len(s) - 1)
    lw = (last.get("value") or 0) + (last.get("waiting") or 0)
    gaps = np.diff(t[~np.isnan(t)])
    interval = max(MIN_INTERVAL_S, float(np.median(gaps))) if len(gaps) else MIN_INTERVAL_S
    if not (lw > 0 and last.get("t_s") is not None):
        return None
    later = [
        e
        for e in events
        if e["input_id"] == s.input_id and e["line"] > last["line"] and (s.run is None or e["run"] == s.run)
    ]
    timed = [e for e in later if e["own_time"] and e["t_s"] is not None]
    finished = [e for e in later if e["kind"] == "request_finished"]
    if not timed or finished:
        return None
    quiet = float(max(e["t_s"] for e in timed) - last["t_s"])
    if quiet < SILENT_INTERVALS * interval:
        return None
    return {"series": s.label, "last": last, "quiet_s": quiet, "interval_s": interval, "after": later[:3], "s": s}


@dataclass(frozen=True)
class StallMeasure:
    """SCH011's numbers: the stuck windows, the silences and the death messages found, per series."""

    series: list[Series]
    metric_running: list[Series]
    events: list[dict]
    deaths: list[dict]
    paths: dict
    stalls: list[dict]
    silences: list[dict]
    table: list[dict]
    had_work: bool
    values: dict


def measure(ctx: Context) -> StallMeasure | str:
    """Every number SCH011 judges by, or the reason (a string) it does not apply."""
    series = [s for s in log_series(ctx, "running", STALL_COLUMNS) if len(s)]
    metric_running = [s for s in metric_series(ctx, "requests_running") if len(s)]
    events = ctx.rows(
        "SELECT input_id, run, line, ts_text, t_s, kind, text, own_time FROM serving_events "
        "WHERE kind NOT IN ('preemption', 'retraction') ORDER BY input_id, line"
    )
    deaths = [e for e in events if e["kind"] in DEATH]
    if not series and not metric_running and not deaths and not any(e["kind"] == "shm_broadcast_wait" for e in events):
        return "missing request counts over time: no vLLM/SGLang stats lines and no timed running-requests scrapes"
    paths = input_paths(ctx)
    stalls: list[dict] = []
    silences: list[dict] = []
    table = []
    had_work = False
    for s in series:
        wins, floor, work = _stuck_windows(s)
        had_work |= work
        stalls += _log_stalls(s, wins, floor)
        silence = _silence(s, events)
        if silence is not None:
            silences.append(silence)
        last = s.point(len(s) - 1)
        table.append(
            {
                "series": s.label,
                "samples": len(s),
                "stuck_windows": len(wins),
                "floor_tok_s": round(floor, 3),
                "last_running": last.get("value"),
                "last_waiting": last.get("waiting"),
            }
        )
    stalls += _metric_stalls(ctx)
    values = {
        "k": K,
        "floor_tok_s": FLOOR_TOK_S,
        "silent_intervals": SILENT_INTERVALS,
        "stalls": len(stalls),
        "silences": len(silences),
        "death_messages": len(deaths),
    }
    return StallMeasure(series, metric_running, events, deaths, paths, stalls, silences, table, had_work, values)


def _judge_no_stall(ms: StallMeasure) -> Check:
    """No stuck window, silence or death: shared-memory waits alone are info; otherwise progress (or idle)."""
    values, table = ms.values, ms.table
    shm = [e for e in ms.events if e["kind"] == "shm_broadcast_wait"]
    if shm:
        e = shm[0]
        return finding(
            RULE,
            severity="info",
            confidence="low",
            impact=0.0,
            formula=FORMULA,
            values=values | {"shm_waits": len(shm)},
            table=table,
            evidence=[log_evidence(ms.paths.get(e["input_id"], "?"), e, "shm_broadcast wait", text=e["text"][:200])],
            substituted=f"{len(shm)} 'No available shared memory broadcast block' messages, no stats to judge",
            title=(
                f"Engine process waited on its workers {len(shm)} times (shared-memory broadcast, 60 s each): "
                "a hang or a long compilation; no stats lines to tell"
            ),
            next_check=(
                "If the server was already serving, a worker is hung: py-spy dump the EngineCore and worker "
                "processes, check NCCL and GPU health; during startup this is compilation or weight load."
            ),
        )
    idle = not ms.had_work and not any(np.nan_to_num(s.v.astype(float)).any() for s in ms.metric_running)
    n = sum(len(s) for s in ms.series) + sum(len(s) for s in ms.metric_running)
    return passed(
        RULE,
        confidence="medium" if n >= 2 * K else "low",
        formula=FORMULA,
        values=values | {"idle": idle},
        table=table,
        substituted=f"{n} samples, no stuck window, no silence after a line with work, no death message",
        title=(
            "Idle: no request was running or waiting, so there was nothing to stall (not a finding)"
            if idle
            else f"The engine made progress whenever requests were in it ({n} samples)"
        ),
    )


def _stall_words(ctx: Context, longest: dict) -> tuple[str, str, list[dict], dict]:
    """The longest stuck window: its sentence, its numbers plugged in, its evidence and values."""
    f, last_p = longest["first"], longest["last"]
    w = longest["window_s"]
    part = (
        f"{longest['work']} requests in the engine and generation below {longest.get('floor', FLOOR_TOK_S):.2g} "
        f"tok/s for {longest['samples']} samples"
        + (f" ({w:.0f} s)" if w is not None else "")
        + f" in {longest['series']}"
    )
    subst = (
        f"{longest['series']}: samples {f.get('line') or f.get('scrape')}…"
        f"{last_p.get('line') or last_p.get('scrape')}: "
        f"Running {f.get('value') if longest['source'] == 'log' else '?'}, Waiting {f.get('waiting')}, "
        f"generation {f.get('gen_tput_tok_s', f.get('tput_tok_s'))} tok/s"
    )
    s = longest["s"]
    evidence = [
        series_evidence(s, f, "first stuck sample", running=f.get("value"), waiting=f.get("waiting")),
        series_evidence(s, last_p, "last stuck sample", running=last_p.get("value"), waiting=last_p.get("waiting")),
    ]
    if longest["source"] == "log":
        before = ctx.rows(
            "SELECT line, ts_text, t_s, kind, text FROM serving_events WHERE input_id = ? AND line < ? "
            "AND kind NOT IN ('access', 'health_check') ORDER BY line DESC LIMIT 2",
            [s.input_id, f["line"]],
        )
        evidence += [log_evidence(s.path, e, f"before the window: {e['kind']}", text=e["text"][:200]) for e in before]
    values = {
        "window_s": w,
        "window_samples": longest["samples"],
        "window_series": longest["series"],
        "requests_in_engine": longest["work"],
    }
    return part, subst, evidence, values


def _silence_words(x: dict) -> tuple[str, str, list[dict], dict]:
    """The longest silence: its sentence, its numbers plugged in, its evidence and values."""
    part = (
        f"stats lines stop for {x['quiet_s']:.0f} s (≥ {SILENT_INTERVALS} × {x['interval_s']:.0f} s) after "
        f"{x['last'].get('ts_text')} with Running {x['last'].get('value')}, Waiting {x['last'].get('waiting')}, "
        "while other lines keep arriving"
    )
    subst = (
        f"{x['series']}: last stats line {x['last'].get('line')}, then {len(x['after'])}+ later lines, "
        f"quiet {x['quiet_s']:.0f} s"
    )
    evidence = [
        series_evidence(
            x["s"],
            x["last"],
            "last stats line before the silence",
            running=x["last"].get("value"),
            waiting=x["last"].get("waiting"),
        )
    ]
    evidence += [log_evidence(x["s"].path, e, f"after: {e['kind']}", text=e["text"][:200]) for e in x["after"][:2]]
    return part, subst, evidence, {"silence_s": x["quiet_s"], "logging_interval_s": x["interval_s"]}


def judge(ctx: Context, ms: StallMeasure) -> Check:
    """Status, severity and words from SCH011's numbers."""
    stalls, silences, deaths = ms.stalls, ms.silences, ms.deaths
    if not stalls and not silences and not deaths:
        return _judge_no_stall(ms)
    values = dict(ms.values)
    longest = max(stalls, key=lambda x: x["window_s"] or 0) if stalls else None
    long_window = (longest and (longest["window_s"] or 0) >= LONG_S) or any(x["quiet_s"] >= LONG_S for x in silences)
    severity = "error" if deaths or long_window else "warning"
    parts, subst, evidence = [], [], []
    said = []
    if longest:
        said.append(_stall_words(ctx, longest))
    if silences:
        said.append(_silence_words(max(silences, key=lambda x: x["quiet_s"])))
    if deaths:
        d = deaths[0]
        kinds = sorted({e["kind"] for e in deaths})
        death_evidence = [
            log_evidence(ms.paths.get(e["input_id"], "?"), e, e["kind"], text=e["text"][:200]) for e in deaths[:2]
        ]
        said.append(
            (
                f"{len(deaths)} dead-engine message(s): {', '.join(kinds)}",
                f"line {d['line']}: {d['text'][:120]}",
                death_evidence,
                {"death_kinds": kinds},
            )
        )
    for part, sub, ev, vals in said:
        parts.append(part)
        subst.append(sub)
        evidence += ev
        values |= vals
    return finding(
        RULE,
        severity=severity,
        confidence="high" if deaths or long_window else "medium",
        impact=1.0 if deaths or long_window else 0.5,
        formula=FORMULA,
        substituted="; ".join(subst),
        values=values,
        table=ms.table,
        evidence=evidence[: max(ctx.settings.max_evidence, 5)],
        title="Engine stalled with work queued: " + "; ".join(parts),
        next_check=(
            "Check worker health and the engine's dead-process messages (EngineDeadError, worker died), NCCL watchdog "
            "timeouts (NCCL_DEBUG=INFO), py-spy dump the engine and worker processes, check GPU health (Xid errors); "
            "restart the replica, and probe liveness on generation progress with requests in flight, not on /health."
        ),
    )


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ctx, ms)
