"""SCH011 Engine stall.

Hypothesis: the most common serving incident is an engine that stops making progress while requests are in it
— a hung collective, a dead worker, a scheduler deadlock — or a process that dies. Requests are running or
waiting, yet no tokens come out; the HTTP front end keeps answering /health and /metrics (a 200 proves nothing),
so dashboards stay green. An engine with no requests that logs nothing is idle, not stalled.

Formula: (a) stuck samples: k ≥ 3 consecutive stats samples (vLLM log lines or scrapes) of one server run with
Running + Waiting > 0 and generation throughput < max(0.5 tok/s, 1 % of the run's median non-zero rate)
(the 2023 `Throughput` counts prompt and generation together; a sample with prompt throughput above the floor
is progress). SGLang lines are not samples of a clock: a decode line is written after every
decode_log_interval decode passes (scheduler_output_processor_mixin.py), so each one is progress, and its
"gen throughput" is averaged since the previous line — after an idle stretch it prints 0.15 tok/s for a
healthy engine. (b) silence (vLLM): the run's last stats line had Running + Waiting > 0, then no stats line
for ≥ 6 logging intervals (median spacing of the run's lines, at least 10 s) while later lines with their own
times arrive, and no later line shows a request finishing (vLLM ≥ 0.8.5 logs an all-zero line at DEBUG, so
silence after a line with work in it is what a hang looks like at INFO; a file that simply ends is not a
silence). (c) hang (SGLang, which logs nothing while an engine is idle): the stats of the whole server run stop
with requests in the engines' last lines and do not resume; the next line, ≥ 6 intervals (at least 60 s)
later, is a health-check failure, a watchdog or a death message — or every engine (two or more) logged its last
line within 2 s of the others with requests running. An engine that falls silent while the others go on is
idle (its last requests finished between two decode lines). (d) death: the catalogue's failure messages
(tracediag/catalog/engine_failures.json: fatal signals and aborts, device runtime errors, device OOM,
collective watchdog timeouts, engine-core deaths, scheduler exceptions, health-check failures); the first in
the log is the cause, every later one and every cascade line (the other ranks' TCPStore / c10d errors) its
consequence. Severity: error with a death message or a stall ≥ 5 minutes, else warning; a shared-memory
broadcast wait alone (also printed during long compilations) is info. Impact: a death affects every request
after it (share of requests: 1); a stall or hang, its window's share of the log's span.

Evidence: the window (first and last stuck sample, or the last stats line and the message that ends the
silence; its length), the engines affected and what was in flight, the log lines just before it, and the
failure quoted with its line number, then its consequences.

What to do: check worker health and the engine's dead-process messages (EngineDeadError, worker died, NCCL
watchdog timeouts — NCCL_DEBUG=INFO, TORCH_NCCL_ASYNC_ERROR_HANDLING), py-spy dump the engine and worker
processes, check GPU health (nvidia-smi, Xid errors; rocm-smi and dmesg on ROCm); restart the replica and add a
liveness probe on generation progress (tokens per interval with requests in flight), not on /health.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tracediag.analyses.serving import Series, input_paths, log_evidence, log_series, metric_series, series_evidence
from tracediag.catalog import failures
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
MIN_HANG_S = 60.0  # the shortest whole-server silence called a hang (SGLang's own watchdog waits 300 s)
SYNC_S = 2.0  # engines whose last lines fall this close together stopped together
STALL_COLUMNS = ("waiting", "gen_tput_tok_s", "prompt_tput_tok_s", "tput_tok_s")  # what a stuck sample is judged on
LONG_S = 300.0
DEATH = failures.CAUSE_KINDS | failures.HANG_KINDS  # a message that the process died or stopped progressing
CASCADE = failures.CASCADE_KINDS
SOFT = failures.SOFT_KINDS
WAITS = SOFT | {"shm_broadcast_wait"}  # an engine waiting long on its workers: a hang or a slow step, info alone
ENDS_SILENCE = DEATH | SOFT | {"shutdown"}
_HEARTBEAT = re.compile(r"last_heartbeat time: ?([\d.:\- ]{1,40}\d)")
FORMULA = (
    "stall: ≥ 3 consecutive samples with Running + Waiting > 0 and generation < max(0.5 tok/s, 1 % of median); "
    "silence: no stats line for ≥ 6 intervals after one with work, while other lines arrive; "
    "hang: the whole server's stats stop with work in flight until a failure message or for ≥ 6 intervals; "
    "death: the first catalogued failure message is the cause, later ones and cascades its consequences"
)


def _is_sglang(s: Series) -> bool:
    return s.source == "log" and str(s.point(0).get("log_format") or "").startswith("sglang")


def _work(p: dict) -> int:
    return int((p.get("value") or 0) + (p.get("waiting") or 0))


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


def _server_runs(series: list[Series]) -> dict[tuple, list[Series]]:
    out: dict[tuple, list[Series]] = {}
    for s in series:
        out.setdefault((s.input_id, s.run), []).append(s)
    return out


def _hang(group: list[Series], events: list[dict]) -> dict | None:
    """SGLang: the whole server run's stats stop with work in flight, and what ends the silence says it hung."""
    lasts = [(s, s.point(len(s) - 1)) for s in group]
    timed = [(s, p) for s, p in lasts if p.get("t_s") is not None]
    if not timed:
        return None
    t_last = max(p["t_s"] for _, p in timed)
    line_last = max(p.get("line") or 0 for _, p in lasts)
    in_flight = [(s, p) for s, p in timed if _work(p) > 0 and p["t_s"] >= t_last - SYNC_S]
    if not in_flight:
        return None
    t_all = np.sort(np.concatenate([s.t.astype(float) for s in group]))
    gaps = np.diff(t_all[~np.isnan(t_all)])
    interval = max(MIN_INTERVAL_S, float(np.median(gaps))) if len(gaps) else MIN_INTERVAL_S
    s0 = group[0]
    later = [
        e
        for e in events
        if e["input_id"] == s0.input_id and e["line"] > line_last and (s0.run is None or e["run"] == s0.run)
    ]
    timed_later = [e for e in later if e["t_s"] is not None and e["own_time"]]
    end = next((e for e in timed_later if e["kind"] in ENDS_SILENCE), None)
    if end is None and timed_later:
        end = timed_later[-1]
    if end is None:
        return None  # the log ends here: a hang cannot be told from a log copied while serving
    quiet = float(end["t_s"] - t_last)
    together = len(group) >= 2 and len(in_flight) == len(group)
    if quiet < max(SILENT_INTERVALS * interval, MIN_HANG_S) or not (end["kind"] in DEATH | SOFT or together):
        return None
    hb = _HEARTBEAT.search(end["text"] or "")
    return {
        "series": ", ".join(s.label for s, _ in in_flight),
        "engines": len(in_flight),
        "engines_logging": len(group),
        "last": max(in_flight, key=lambda sp: sp[1]["t_s"])[1],
        "in_flight": [(s, p) for s, p in in_flight],
        "running": sum(int(p.get("value") or 0) for _, p in in_flight),
        "waiting": sum(int(p.get("waiting") or 0) for _, p in in_flight),
        "quiet_s": quiet,
        "interval_s": interval,
        "end": end,
        "last_heartbeat": hb[1] if hb else None,
        "s": in_flight[0][0],
    }


def _failure_chain(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """(failures, cascade lines): per log, the failure messages in file order (the first is the cause) and the
    lines other ranks print once a peer is gone."""
    return [e for e in events if e["kind"] in DEATH], [e for e in events if e["kind"] in CASCADE]


def _in_flight_before(series: list[Series], e: dict) -> dict:
    """What the engines of the failure's log held at their last stats line before it."""
    running = waiting = engines = 0
    for s in series:
        if s.input_id != e["input_id"] or (s.run is not None and s.run != e["run"]):
            continue
        lines = s.cols["line"].astype(float)
        i = int(np.searchsorted(lines, e["line"])) - 1
        if i >= 0:
            p = s.point(i)
            running += int(p.get("value") or 0)
            waiting += int(p.get("waiting") or 0)
            engines += 1
    return {"running": running, "waiting": waiting, "engines": engines}


@dataclass(frozen=True)
class StallMeasure:
    """SCH011's numbers: the stuck windows, the silences, hangs and failure messages found, per series."""

    series: list[Series]
    metric_running: list[Series]
    events: list[dict]
    deaths: list[dict]
    cascade: list[dict]
    paths: dict
    stalls: list[dict]
    silences: list[dict]
    hangs: list[dict]
    table: list[dict]
    had_work: bool
    span_s: float | None
    values: dict


def _span(series: list[Series]) -> float | None:
    t = np.concatenate([s.t.astype(float) for s in series]) if series else np.array([])
    t = t[~np.isnan(t)]
    return float(t.max() - t.min()) if len(t) > 1 and t.max() > t.min() else None


def measure(ctx: Context) -> StallMeasure | str:
    """Every number SCH011 judges by, or the reason (a string) it does not apply."""
    series = [s for s in log_series(ctx, "running", STALL_COLUMNS) if len(s)]
    metric_running = [s for s in metric_series(ctx, "requests_running") if len(s)]
    events = ctx.rows(
        "SELECT input_id, run, line, ts_text, t_s, kind, text, own_time, pattern FROM serving_events "
        "WHERE kind NOT IN ('preemption', 'retraction') ORDER BY input_id, line"
    )
    deaths, cascade = _failure_chain(events)
    if not series and not metric_running and not deaths and not any(e["kind"] in WAITS | CASCADE for e in events):
        return "missing request counts over time: no vLLM/SGLang stats lines and no timed running-requests scrapes"
    paths = input_paths(ctx)
    stalls: list[dict] = []
    silences: list[dict] = []
    table = []
    had_work = False
    sglang = {id(s) for s in series if _is_sglang(s)}
    for s in series:
        if id(s) in sglang:  # every SGLang line is progress; idle engines write nothing (see (c))
            wins, floor, work = [], FLOOR_TOK_S, bool((np.nan_to_num(s.v.astype(float)) > 0).any())
        else:
            wins, floor, work = _stuck_windows(s)
            silence = _silence(s, events)
            if silence is not None:
                silences.append(silence)
        had_work |= work
        stalls += _log_stalls(s, wins, floor)
        last = s.point(len(s) - 1)
        table.append(
            {
                "series": s.label,
                "samples": len(s),
                "stuck_windows": len(wins),
                "floor_tok_s": round(floor, 3) if id(s) not in sglang else None,
                "last_running": last.get("value"),
                "last_waiting": last.get("waiting"),
                "last_time": last.get("ts_text"),
            }
        )
    hangs = [
        h for g in _server_runs([s for s in series if id(s) in sglang]).values() if (h := _hang(g, events)) is not None
    ]
    stalls += _metric_stalls(ctx)
    values = {
        "k": K,
        "floor_tok_s": FLOOR_TOK_S,
        "silent_intervals": SILENT_INTERVALS,
        "stalls": len(stalls),
        "silences": len(silences),
        "hangs": len(hangs),
        "death_messages": len(deaths),
        "cascade_lines": len(cascade),
    }
    return StallMeasure(
        series, metric_running, events, deaths, cascade, paths, stalls, silences, hangs, table, had_work,
        _span(series), values,
    )  # fmt: skip


def _judge_no_stall(ms: StallMeasure) -> Check:
    """No stuck window, silence or death: shared-memory waits alone are info; otherwise progress (or idle)."""
    values, table = ms.values, ms.table
    if ms.cascade:
        return _cascade_only(ms)
    soft = [e for e in ms.events if e["kind"] in SOFT]
    if soft:
        return _soft_watchdog(ms, soft)
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


def _cascade_only(ms: StallMeasure) -> Check:
    """Lines that say a peer is gone (TCPStore / c10d errors) and no failure of this log's own: the group is broken,
    and the cause is in another rank's or node's log."""
    e = ms.cascade[0]
    path = ms.paths.get(e["input_id"], "?")
    return finding(
        RULE,
        severity="error",
        confidence="medium",
        impact=1.0,
        impact_basis="requests after the failure (the process group is broken)",
        formula=FORMULA,
        values=ms.values | {"first_cascade_line": e["line"], "first_cascade_pattern": e.get("pattern")},
        table=ms.table,
        evidence=[
            log_evidence(ms.paths.get(c["input_id"], "?"), c, f"cascade: {c.get('pattern')}", text=c["text"][:200])
            for c in ms.cascade[:3]
        ],
        substituted=f"{len(ms.cascade)} cascade line(s) from line {e['line']} of {path}, no failure of this log's own",
        title=(
            f"A peer process is gone: {len(ms.cascade)} TCPStore / c10d line(s) from line {e['line']} "
            f"({e['text'][:100]!r}); the failure that caused them is in another rank's log"
        ),
        next_check=(
            "Find the rank or node that failed first (its log has a device error, a fatal signal or an OOM before "
            "these lines); the ranks that print TCPStore / 'should dump' errors are its consequences."
        ),
    )


def _soft_watchdog(ms: StallMeasure, soft: list[dict]) -> Check:
    """A watchdog that dumped the stacks (SGLang's py-spy dump) but did not kill: a slow or stuck step, info."""
    e = soft[0]
    return finding(
        RULE,
        severity="info",
        confidence="low",
        impact=None,
        formula=FORMULA,
        values=ms.values | {"watchdog_dumps": len(soft)},
        table=ms.table,
        evidence=[log_evidence(ms.paths.get(e["input_id"], "?"), e, "watchdog dump", text=e["text"][:200])],
        substituted=f"{len(soft)} watchdog dump(s), first at line {e['line']}; no stall, hang or death in the stats",
        title=(
            f"The watchdog dumped the scheduler stacks {len(soft)} time(s) (line {e['line']}, {e['ts_text']}) but "
            "the stats show no stall: a slow step, or the watchdog of an idle process (SGLang #20766)"
        ),
        next_check=(
            "Read the dumped stacks: a scheduler thread inside a collective or a CUDA call is a hang in the making; "
            "a data-parallel controller on a node that serves no requests is the watchdog's own false alarm."
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


def _hang_words(ctx: Context, h: dict) -> tuple[str, str, list[dict], dict]:
    """The longest hang: its sentence, its numbers plugged in, its evidence and values."""
    last, end = h["last"], h["end"]
    ends = (
        f"a {end['kind'].replace('_', ' ')} message at line {end['line']}"
        if end["kind"] in DEATH
        else f"{end['kind']} at line {end['line']}"
    )
    part = (
        f"the whole server hung: {h['engines']} of {h['engines_logging']} engine(s) logged their last stats line at "
        f"{last.get('ts_text')} with {h['running']} running and {h['waiting']} queued, then nothing for "
        f"{h['quiet_s'] / 60:.1f} min until {ends} ({end['ts_text']})"
        + (f", last heartbeat {h['last_heartbeat']}" if h["last_heartbeat"] else "")
    )
    subst = (
        f"t_last = {last.get('ts_text')}, next line {end['ts_text']} (line {end['line']}): quiet "
        f"{h['quiet_s']:.0f} s ≥ max({SILENT_INTERVALS} × {h['interval_s']:.0f} s, {MIN_HANG_S:.0f} s)"
    )
    path = h["s"].path
    evidence = [
        series_evidence(s, p, "last stats line before the hang", running=p.get("value"), waiting=p.get("waiting"))
        for s, p in h["in_flight"][:3]
    ]
    evidence.append(log_evidence(path, end, f"ends the silence: {end['kind']}", text=end["text"][:200]))
    values = {
        "hang_s": h["quiet_s"],
        "hang_start": last.get("ts_text"),
        "hang_end": end["ts_text"],
        "hang_end_line": end["line"],
        "hang_end_kind": end["kind"],
        "engines_hung": h["engines"],
        "engines_logging": h["engines_logging"],
        "running_at_hang": h["running"],
        "waiting_at_hang": h["waiting"],
        "logging_interval_s": h["interval_s"],
        "last_heartbeat": h["last_heartbeat"],
    }
    return part, subst, evidence, values


ROOT_KINDS = ("device_error", "oom")  # the device's own failure: every other message of the chain follows from it


def _cause(deaths: list[dict]) -> dict:
    """The failure that caused the others: the first device error or OOM when the chain has one (a worker's stderr
    reaches the log after the API server's 'engine dead' lines: processes flush at different times), else the
    first failure message in the file."""
    return next((e for e in deaths if e["kind"] in ROOT_KINDS), deaths[0])


def _heartbeat_gap(d: dict) -> float | None:
    """Seconds from the last heartbeat a health-check failure names to the failure's own time (same day)."""
    hb = _HEARTBEAT.search(d["text"] or "")
    ts = re.search(r"(\d{2}):(\d{2}):(\d{2})$", (d["ts_text"] or "").strip())
    hm = re.search(r"(\d{2}):(\d{2}):(\d{2})", hb[1]) if hb else None
    if not (ts and hm):
        return None
    sec = [int(ts[1]) * 3600 + int(ts[2]) * 60 + int(ts[3]), int(hm[1]) * 3600 + int(hm[2]) * 60 + int(hm[3])]
    return float((sec[0] - sec[1]) % 86400)


def _death_words(ms: StallMeasure) -> tuple[str, str, list[dict], dict]:
    """The failure that caused the others (the cause), what the engines held then, and its consequences."""
    d = _cause(ms.deaths)
    path = ms.paths.get(d["input_id"], "?")
    later = [e for e in ms.deaths if e is not d]
    cascade = [e for e in ms.cascade if e["input_id"] == d["input_id"]]
    held = _in_flight_before(ms.series, d)
    pattern = failures.by_id(d.get("pattern"))
    part = f"{d['kind'].replace('_', ' ')} at line {d['line']}" + (f" ({d['ts_text']})" if d["ts_text"] else "")
    part += f": {d['text'][:160]!r}"
    gap = _heartbeat_gap(d) if d["kind"] in failures.HANG_KINDS else None
    if gap is not None:
        part += f" — no heartbeat for {gap / 60:.1f} min before it"
    if d is not ms.deaths[0]:
        first = ms.deaths[0]
        part += f" (printed after line {first['line']}'s {first['kind'].replace('_', ' ')}, its consequence)"
    if held["engines"]:
        part += f" with {held['running']} running and {held['waiting']} queued on {held['engines']} engine(s)"
    then = []
    if later:
        then.append(f"{len(later)} later failure message(s) ({', '.join(sorted({e['kind'] for e in later}))})")
    if cascade:
        then.append(f"{len(cascade)} cascade line(s) from the other ranks (a peer is gone)")
    if then:
        part += "; then " + " and ".join(then) + ", consequences of it"
    evidence = [log_evidence(path, d, f"cause: {d['kind']}", text=d["text"][:200], pattern=d.get("pattern"))]
    evidence += [
        log_evidence(ms.paths.get(e["input_id"], "?"), e, f"consequence: {e['kind']}", text=e["text"][:200])
        for e in [*later[:1], *cascade[:1]]
    ]
    values = {
        "death_kinds": sorted({e["kind"] for e in ms.deaths}),
        "cause_line": d["line"],
        "cause_kind": d["kind"],
        "heartbeat_gap_s": gap,
        "cause_pattern": d.get("pattern"),
        "cause_printed_by": pattern.printed_by if pattern else None,
        "later_failures": len(later),
        "cascade_lines": len(cascade),
        "running_before_failure": held["running"] if held["engines"] else None,
        "waiting_before_failure": held["waiting"] if held["engines"] else None,
    }
    return part, f"line {d['line']}: {d['text'][:120]}", evidence, values


def judge(ctx: Context, ms: StallMeasure) -> Check:
    """Status, severity and words from SCH011's numbers."""
    stalls, silences, hangs, deaths = ms.stalls, ms.silences, ms.hangs, ms.deaths
    if not stalls and not silences and not hangs and not deaths:
        return _judge_no_stall(ms)
    values = dict(ms.values)
    longest = max(stalls, key=lambda x: x["window_s"] or 0) if stalls else None
    windows = [longest["window_s"] or 0] if longest else []
    windows += [x["quiet_s"] for x in silences] + [h["quiet_s"] for h in hangs]
    long_window = any(w >= LONG_S for w in windows)
    dead = any(e["kind"] in failures.CAUSE_KINDS for e in deaths)
    severity = "error" if deaths or long_window else "warning"
    said = []
    if hangs:  # the window first; a health-check failure that ends it is said after it
        said.append(_hang_words(ctx, max(hangs, key=lambda x: x["quiet_s"])))
    if deaths:
        said.insert(0 if dead else len(said), _death_words(ms))
    if longest:
        said.append(_stall_words(ctx, longest))
    if silences:
        said.append(_silence_words(max(silences, key=lambda x: x["quiet_s"])))
    parts, subst, evidence = [], [], []
    for part, sub, ev, vals in said:
        parts.append(part)
        subst.append(sub)
        evidence += ev
        values |= vals
    if dead:
        impact, basis = 1.0, "requests after the failure (the process stopped serving)"
        title = "Server process died: " + "; ".join(parts)
    else:
        share = min(1.0, max(windows) / ms.span_s) if windows and ms.span_s else None
        impact, basis = (share, "the log's time span (no tokens came out)") if share else (None, None)
        if impact is None and deaths:  # the server's own health check says it stopped progressing
            impact, basis = 1.0, "requests in flight (the server stopped answering its health check)"
        title = ("Server hung: " if hangs or deaths else "Engine stalled with work queued: ") + "; ".join(parts)
    return finding(
        RULE,
        severity=severity,
        confidence="high" if deaths or long_window else "medium",
        impact=impact,
        impact_basis=basis,
        formula=FORMULA,
        substituted="; ".join(subst),
        values=values,
        table=ms.table,
        evidence=evidence[: max(ctx.settings.max_evidence, 5)],
        title=title,
        next_check=(
            "Start at the first failure: it is the cause, the lines after it are other ranks losing their peer. "
            "Check worker health and the engine's dead-process messages (EngineDeadError, worker died), NCCL/RCCL "
            "watchdog timeouts (NCCL_DEBUG=INFO), py-spy dump the engine and worker processes, check GPU health "
            "(Xid errors in dmesg, nvidia-smi / rocm-smi); restart the replica, and probe liveness on generation "
            "progress with requests in flight, not on /health."
        ),
    )


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ctx, ms)
