"""What the host did while the GPU idled: a long GPU gap attributed to the host work that covers it.

The host thread is the one that launched the GPU work that ends the gap (the runtime call with the same
correlation id); without one, every thread of the rank. On it, every host span overlapping the gap — CPU ops,
Python frames (Kineto with_stack=True, kept with --keep-python), NVTX and record_function ranges (the step's own
marker left out: it says nothing of what the host did), runtime calls — is clipped to the gap. Per span name the
coverage is the time-weighted union of its clipped spans (instances that nest or repeat count once), and the
whole host coverage is the union of every span. Named are the innermost spans that cover most of the gap: the
name with the shortest longest instance among those covering at least half of it (the deepest frame the host was
in), the next such name around it (what called it), then the names inside it that cover the most; without such a
name, the names that cover the most. Less than
half of the gap covered is "untraced host time": the host ran code no event records (Python without stack
events, an untraced library, the OS). Said in docs/method.md (KRN006).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from tracediag.context import Context

COVERS_MOST = 0.5  # a span name covering this share of the gap can lead; less host coverage is untraced time
MIN_SHARE = 0.01  # names covering less of the gap are not named
NAMED = 3  # at most this many names
PY_FRAME = r"\.py\(\d+\): |^<built-in |^nn\.Module: "  # Kineto python_function names (kept in cpu_ops)
KIND_LABEL = {
    "python": "Python frame",
    "cpu_op": "CPU op",
    "nvtx": "NVTX range",
    "annotation": "annotation",
    "runtime": "runtime call",
}

_THREAD_SQL = """
WITH g AS (
    SELECT correlation, ts_ns FROM kernels WHERE rank = ? AND ts_ns >= ? AND correlation > 0
    UNION ALL SELECT correlation, ts_ns FROM memops WHERE rank = ? AND ts_ns >= ? AND correlation > 0
    ORDER BY ts_ns LIMIT 1
)
SELECT r.tid FROM runtime r JOIN g ON r.correlation = g.correlation WHERE r.rank = ? LIMIT 1
"""
# the host spans of one thread over [t0, t1), clipped: per name its union (islands of its spans), and the union
# of all; {thread} is 'tid = ?' or 'true'
_SPANS_SQL = """
WITH spans AS (
    SELECT CASE WHEN regexp_matches(name, '{py}') THEN 'python' ELSE 'cpu_op' END AS kind, name, ts_ns, dur_ns,
           input_dims
    FROM cpu_ops WHERE rank = $rank AND {thread} AND ts_ns < $t1 AND ts_ns + dur_ns > $t0
    UNION ALL
    SELECT CASE source WHEN 'nvtx' THEN 'nvtx' WHEN 'python_function' THEN 'python' ELSE 'annotation' END,
           a.name, a.ts_ns, a.dur_ns, a.input_dims
    FROM annotations a
    WHERE a.rank = $rank AND {thread} AND a.source <> 'gpu_user_annotation' AND a.ts_ns < $t1
      AND a.ts_ns + a.dur_ns > $t0
      AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.rank = a.rank AND s.ts_ns = a.ts_ns AND s.name = a.name)
    UNION ALL
    SELECT 'runtime', name, ts_ns, dur_ns, NULL FROM runtime
    WHERE rank = $rank AND {thread} AND ts_ns < $t1 AND ts_ns + dur_ns > $t0
),
c AS (SELECT *, greatest(ts_ns, $t0) AS s, least(ts_ns + dur_ns, $t1) AS e FROM spans),
n1 AS (SELECT kind, name, s, e, max(e) OVER (PARTITION BY kind, name ORDER BY s, e
                                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e FROM c),
n2 AS (SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
                     OVER (PARTITION BY kind, name ORDER BY s, e) AS island FROM n1),
per AS (SELECT kind, name, sum(e - s) AS covered_ns
        FROM (SELECT kind, name, island, min(s) AS s, max(e) AS e FROM n2 GROUP BY ALL) GROUP BY ALL),
a1 AS (SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e FROM c),
a2 AS (SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END) OVER (ORDER BY s, e) AS island
       FROM a1),
tot AS (SELECT coalesce(sum(e - s), 0) AS all_ns FROM (SELECT island, min(s) AS s, max(e) AS e FROM a2 GROUP BY ALL)),
agg AS (SELECT kind, name, count(*) AS instances, min(ts_ns) AS ts_ns, max(dur_ns) AS max_dur_ns,
               sum(dur_ns) AS dur_ns, any_value(input_dims) AS input_dims FROM c GROUP BY ALL)
SELECT agg.*, per.covered_ns, tot.all_ns FROM agg JOIN per USING (kind, name), tot
ORDER BY per.covered_ns DESC, agg.max_dur_ns, agg.name LIMIT 50
"""


@dataclass(frozen=True)
class GapAttribution:
    """The host work during one GPU gap: the named spans with the share of the gap each covers, and the rest."""

    rank: int
    ts_ns: int
    gap_ns: int
    thread: str | None  # the launching host thread (None: every thread of the rank)
    spans: list[dict[str, Any]] = field(default_factory=list)  # kind, name, covered_ns, share, instances, ...
    covered_ns: int = 0  # union of every host span in the gap, ns
    python_frames: bool = False  # the rank's store holds Python frames
    python_skipped: int = 0  # python_function events the ingest left out (kept with --keep-python)
    format: str | None = None

    @property
    def covered_share(self) -> float:
        return self.covered_ns / self.gap_ns if self.gap_ns else 0.0

    @property
    def untraced_ns(self) -> int:
        return max(0, self.gap_ns - self.covered_ns)

    @property
    def untraced(self) -> bool:
        """Less than half of the gap is covered by any recorded host span."""
        return self.covered_share < COVERS_MOST

    def words(self) -> str:
        """'MPI_Recv (NVTX range) 18 % of the gap, ...; 69 % untraced host time'."""
        named = ""
        for s in self.spans:
            one = f"{s['name']}{dims_text(s['input_dims'])} ({KIND_LABEL[s['kind']]}) {s['share']:.0%}"
            named += (" in " if s["role"] == "around it" else ", " if named else "") + one
        text = (named + " of the gap") if named else "no recorded host span covers 1 % of the gap"
        if self.untraced:
            text += f"; {self.untraced_ns / self.gap_ns:.0%} untraced host time"
        return text

    def advice(self) -> str | None:
        """How to name the host code in the gap when Python frames are absent, else None."""
        if self.python_frames:
            return None
        if self.python_skipped:
            return (
                f"Run tracediag with --keep-python: the trace holds {self.python_skipped:,} Python frames that name "
                "the host code in the gap."
            )
        if self.format == "kineto":
            return "Capture with torch.profiler(..., with_stack=True) so Python frames name the host code in the gap."
        return (
            "Capture Python frames (torch.profiler with_stack=True; nsys profile --python-sampling=true) or NVTX "
            "ranges around the host loop so the host code in the gap is named."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "ts_ns": self.ts_ns,
            "gap_ns": self.gap_ns,
            "thread": self.thread,
            "covered_ns": self.covered_ns,
            "covered_share": round(self.covered_share, 4),
            "untraced_host_ns": self.untraced_ns,
            "python_frames": self.python_frames,
            "advice": self.advice(),
            "spans": [
                {k: s[k] for k in ("kind", "name", "role", "covered_ns", "instances", "ts_ns", "max_dur_ns")}
                | {"share_of_gap": round(s["share"], 4)}
                for s in self.spans
            ],
        }


def dims_text(raw: str | None) -> str:
    """' [[4096, 2880], [2880]]': an op's recorded input dims, compact, after its name (empty if none)."""
    if not raw:
        return ""
    try:
        return " " + orjson.dumps(orjson.loads(raw)).decode()
    except orjson.JSONDecodeError:
        return ""


def _named(rows: list[dict[str, Any]], gap: int) -> list[dict[str, Any]]:
    """The innermost name covering most of the gap, the next one around it, then what inside it covers the most;
    without a name covering most of the gap, the names that cover the most."""
    rows = [r | {"share": r["covered_ns"] / gap} for r in rows if r["covered_ns"] >= MIN_SHARE * gap]
    most = sorted(
        (r for r in rows if r["covered_ns"] >= COVERS_MOST * gap), key=lambda r: (r["max_dur_ns"], -r["covered_ns"])
    )
    if not most:
        return [r | {"role": "covers the most"} for r in rows[:NAMED]]
    lead = most[0]
    out = [lead | {"role": "innermost span covering most of the gap"}]
    if len(most) > 1:
        out.append(most[1] | {"role": "around it"})
    inside = [r for r in rows if r is not lead and r["max_dur_ns"] <= lead["max_dur_ns"]]
    return out + [r | {"role": "inside it"} for r in inside[: NAMED - len(out)]]


def attribute_gap(ctx: Context, rank: int, t0: int, gap_ns: int) -> GapAttribution:
    """The host work covering the GPU gap [t0, t0 + gap_ns) of `rank`, on the thread that launched what ends it."""
    t1 = t0 + gap_ns
    thread = ctx.scalar(_THREAD_SQL, [rank, t1, rank, t1, rank])
    sql = _SPANS_SQL.format(py=PY_FRAME, thread="tid = $tid" if thread is not None else "true")
    params: dict[str, Any] = {"rank": rank, "t0": t0, "t1": t1} | ({"tid": thread} if thread is not None else {})
    cur = ctx.con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    python = ctx.once(
        ("host_gaps.python", rank),
        lambda: bool(
            ctx.scalar(
                f"SELECT count(*) FROM (SELECT 1 FROM cpu_ops WHERE rank = ? AND regexp_matches(name, '{PY_FRAME}') "
                "LIMIT 1)",
                [rank],
            )
        ),
    )
    inp = ctx.rows(
        "SELECT coalesce(sum(events_python_skipped), 0) AS skipped, any_value(format) AS format FROM inputs "
        "WHERE rank = ?",
        [rank],
    )
    return GapAttribution(
        rank=rank,
        ts_ns=t0,
        gap_ns=gap_ns,
        thread=thread,
        spans=_named(rows, gap_ns) if gap_ns > 0 else [],
        covered_ns=int(rows[0]["all_ns"]) if rows else 0,
        python_frames=python,
        python_skipped=int(inp[0]["skipped"]) if inp else 0,
        format=inp[0]["format"] if inp else None,
    )


# The GPU work that ends a gap, with the runtime call that launched it and the stream-wait calls on that thread
# shortly before the launch (what a queued kernel can be held behind)
_ENDING_SQL = """
WITH a AS (
    SELECT name, ts_ns, correlation, stream FROM kernels WHERE rank = $rank AND ts_ns >= $t1 - 1
    UNION ALL SELECT name, ts_ns, correlation, stream FROM memops WHERE rank = $rank AND ts_ns >= $t1 - 1
    ORDER BY ts_ns LIMIT 1
)
SELECT a.name, a.ts_ns, a.stream, r.name AS api, r.ts_ns AS launch_ns, r.tid,
       (SELECT w.name FROM runtime w WHERE w.rank = $rank AND w.tid = r.tid AND w.ts_ns < r.ts_ns
          AND w.ts_ns >= least(r.ts_ns, $t0) - 1000000 AND regexp_matches(w.name, 'StreamWaitEvent|StreamWaitValue')
        ORDER BY w.ts_ns DESC LIMIT 1) AS waited_with
FROM a LEFT JOIN runtime r ON r.rank = $rank AND r.correlation = a.correlation AND a.correlation > 0
ORDER BY r.ts_ns LIMIT 1
"""


@dataclass(frozen=True)
class GapDirection:
    """Who waits for whom in one GPU gap [ts_ns, ts_ns + gap_ns): the GPU work that ends it and when the host
    launched it. Idle after the launch (beyond the launch latency) is the GPU holding queued work (a device-side
    wait); idle before it is the host not giving the GPU work (derive/windows.py, QUEUE_LATENCY_NS)."""

    rank: int
    ts_ns: int
    gap_ns: int
    ending: str | None  # the kernel or copy that ends the gap
    api: str | None  # the runtime call that launched it
    launch_ns: int | None  # when
    waited_with: str | None  # a stream-wait call on the launching thread just before the launch
    queued_ns: int  # of the gap, idle with that work already launched

    @property
    def queued(self) -> bool:
        """Most of the gap the GPU held work already launched: the GPU, not the host, is behind."""
        return self.gap_ns > 0 and self.queued_ns >= COVERS_MOST * self.gap_ns

    def words(self) -> str:
        """'resolve_future_token_ids (launched by hipLaunchKernel 493 ms before it ran, after hipStreamWaitEvent)'."""
        if not self.ending:
            return "no GPU work after the gap"
        end = self.ts_ns + self.gap_ns
        lag = f"{(end - self.launch_ns) / 1e6:.3g} ms before it ran" if self.launch_ns is not None else "launch unknown"
        after = f", after {self.waited_with} on the launching thread" if self.waited_with else ""
        return f"{self.ending[:120]} (launched by {self.api or '?'} {lag}{after})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "ts_ns": self.ts_ns,
            "gap_ns": self.gap_ns,
            "ending": self.ending,
            "launched_by": self.api,
            "launch_ns": self.launch_ns,
            "waited_with": self.waited_with,
            "queued_ns": self.queued_ns,
            "queued_share_of_gap": round(self.queued_ns / self.gap_ns, 4) if self.gap_ns else None,
        }


def gap_direction(ctx: Context, rank: int, t0: int, gap_ns: int, latency_ns: int) -> GapDirection:
    """Who waits for whom in the GPU gap [t0, t0 + gap_ns) of `rank` (GapDirection); `latency_ns` is the launch
    latency allowed before launched work counts as queued."""
    t1 = t0 + gap_ns
    rows = ctx.con.execute(_ENDING_SQL, {"rank": rank, "t0": t0, "t1": t1}).fetchall()
    if not rows:
        return GapDirection(rank, t0, gap_ns, None, None, None, None, 0)
    name, _, _, api, launch, _, waited = rows[0]
    queued = max(0, t1 - max(t0, launch + latency_ns)) if launch is not None else 0
    return GapDirection(rank, t0, gap_ns, name, api, launch, waited, int(queued))
