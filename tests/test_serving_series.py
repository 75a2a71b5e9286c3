"""Log series (tracediag/analyses/serving.py log_series) on real logs: only the columns a rule asks for are
fetched, and a point's text columns, read from the store for that sample alone, are those of its own stats line."""

from __future__ import annotations

from pathlib import Path

from tracediag.analyses.serving import log_series
from tracediag.context import Context, Settings
from tracediag.pipeline import build_store

EXTERNAL = Path(__file__).resolve().parent / "data" / "external"
LOGS = [
    (EXTERNAL / "vllm" / "log_excerpts" / "vllm-37307_v1_2026-03_waiting_drains_under_prefill.log", "vllm-log"),
    (EXTERNAL / "sglang" / "log_excerpts" / "sglang-6778_token_usage_0.96_no_timestamp.log", "sglang-log"),
]


def test_points_read_their_own_line_texts_and_only_the_asked_columns():
    for path, fmt in LOGS:
        con = build_store([(path, fmt)])
        try:
            series = log_series(Context(con=con, model=None, tp=None, settings=Settings()), "waiting", ("running",))
            assert series, path.name
            want = {
                (r[0], r[1]): ("?" if r[2] is None else r[2], "?" if r[3] is None else r[3])
                for r in con.execute("SELECT input_id, line, ts_text, log_format FROM serving_stats").fetchall()
            }
            n = 0
            for s in series:
                assert set(s.cols) == {"input_id", "run", "engine", "pid", "line", "t_s", "value", "running"}
                for i in range(len(s)):
                    p = s.point(i)
                    assert (p["ts_text"], p["log_format"]) == want[(p["input_id"], p["line"])], (path.name, i)
                    n += 1
            assert n == len(want), path.name
        finally:
            con.close()
