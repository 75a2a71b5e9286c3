"""SGLang server logs under every layout they reach users in, on real excerpts (tests/data/external/sglang/): the
engine's own `[time DPn TPn EPn]` prefix, the application's Python logging, Ray actor and compose prefixes; the
retraction and decode-OOM messages, speculative fields, DP/TP/EP tags and same-second samples. Field meanings are
SGLang's (python/sglang/srt/managers/scheduler_metrics_mixin.py log_prefill_stats / log_decode_stats)."""

from __future__ import annotations

import json
import logging
import os
import re

from conftest import EXTERNAL

from tracediag.ingest import detect_format
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.sglang_log import parse_sglang_log
from tracediag.model.servingmath import spread_ties

LOGS = EXTERNAL / "sglang" / "log_excerpts"
OPTS = IngestOptions()


def _rows(path, table="serving_stats"):
    return parse_sglang_log(path, 0, OPTS).tables[table].to_pylist()


def test_python_logging_layout_with_logger_name():
    """sglang-omni #712: `2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: Decode batch…`
    — no bracket prefix, no rank tag; was refused as "not an SGLang log"."""
    path = LOGS / "sglang-omni-712_python_logging_layout_scheduler_metrics_mixin.log"
    assert detect_format(path) == "sglang-log"
    rows = _rows(path)
    assert [(r["line"], r["t_s"], r["running"], r["waiting"]) for r in rows] == [
        (1, 0.0, 1, 0), (3, 0.0, 0, 0), (4, 1.0, 1, 0), (6, 1.0, 0, 0), (7, 1.0, 1, 0),
    ]  # fmt: skip
    assert [r["gen_tput_tok_s"] for r in rows if r["log_format"] == "sglang-decode"] == [126.29, 83.17, 82.34]
    assert {r["engine"] for r in rows} == {None}
    events = _rows(path, "serving_events")
    assert [e["text"] for e in events] == ["POST /v1/audio/speech 200"] * 3


def test_python_logging_layout_with_pid_and_file(tmp_path):
    """The layout `%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d] %(message)s` (an application's
    logging.basicConfig), rendered by Python's logging from the real messages of SGLang #14972."""
    src = (LOGS / "sglang-14972_token_usage_0.94_queue_before_retract.log").read_text()
    messages = [re.sub(r"^\[[^\]]*\]\s*", "", ln) for ln in src.splitlines() if ln.strip()]
    out = tmp_path / "app.log"
    handler = logging.FileHandler(out)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d] %(message)s")
    )
    log = logging.getLogger("sglang.srt.managers.scheduler_metrics_mixin.test")
    log.propagate, log.level = False, logging.INFO
    log.addHandler(handler)
    try:
        for m in messages:
            log.info(m)
    finally:
        log.removeHandler(handler)
        handler.close()
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO \d+ \[test_ingest_sglang\.py:\d+\] Decode", out.read_text()
    )
    rows = _rows(out)
    assert len(rows) == len(messages) == 5
    assert {(r["running"], r["waiting"], r["kv_usage_pct"]) for r in rows} == {(6, 5, 94.0)}
    assert {r["pid"] for r in rows} == {os.getpid()} and {r["process"] for r in rows} == {"python-logging"}


def test_ray_actor_prefix_names_the_process(tmp_path):
    """Ray prints an actor's output behind `(SGLangEngine pid=N)` (as in THUDM/slime #1487): two engines with the
    same `TP0`-free DP prefixes stay two series. Built from the real lines of SGLang #20766."""
    lines = (LOGS / "sglang-20766_dp8_to_dp15_balanced_decode.log").read_text().splitlines()
    out = tmp_path / "ray.log"
    out.write_text(
        "\n".join(f"(SGLangEngine pid={4000 + i % 2}) {ln}" for i, ln in enumerate(lines))
        + '\n(SGLangEngine pid=4000, ip=10.0.0.2) [2026-03-17 17:35:08] INFO:     10.0.0.1:1 - "GET /metrics '
        + 'HTTP/1.1" 200 OK\n'
    )
    rows = _rows(out)
    assert len(rows) == 8 and {r["pid"] for r in rows} == {4000, 4001}
    assert {r["process"] for r in rows} >= {"SGLangEngine DP9 TP9", "SGLangEngine DP8 TP8"}
    (access,) = _rows(out, "serving_events")
    assert access["pid"] == 4000 and access["kind"] == "access"


def test_dp_tp_ep_prefixes_give_the_data_parallel_rank_as_engine():
    dp = _rows(LOGS / "sglang-17392_dp_tp_ep_pd_decode_uneven_running.log")
    assert [(r["engine"], r["process"], r["running"]) for r in dp] == [
        (0, "DP0 TP0 EP0", 8), (3, "DP3 TP3 EP3", 6), (2, "DP2 TP2 EP2", 11),
    ]  # fmt: skip
    extra = json.loads(dp[0]["extra_json"])
    assert extra["#retracted-req"] == 0 and extra["pre-allocated usage"] == 0.0  # PD decode fields kept
    assert {r["engine"] for r in _rows(LOGS / "sglang-36081_tp0_ep0_spec_accept_len_rate_healthy.log")} == {0}
    assert {r["engine"] for r in _rows(LOGS / "sglang-20766_dp8_to_dp15_balanced_decode.log")} == set(range(8, 16))


def test_retraction_and_decode_out_of_memory_messages():
    """#4184 (2025-03): `Decode out of memory happened. #retracted_reqs: 1, …` on every TP rank of one engine."""
    events = _rows(LOGS / "sglang-4184_decode_out_of_memory_retract_tp8_to_tp15.log", "serving_events")
    assert len(events) == 11 and {e["kind"] for e in events} == {"retraction"}
    assert {e["cumulative"] for e in events} == {1} and events[0]["process"] == "TP13"


def test_speculative_fields_per_engine():
    """accept len = (accepted + 1) per verify round, accept rate = over the draft tokens verified (SGLang's
    log_decode_stats); each decode line with them is a spec_decode row of its engine."""
    spec = _rows(LOGS / "sglang-36081_tp0_ep0_spec_accept_len_rate_healthy.log", "spec_decode")
    assert [(r["mean_acceptance_length"], r["acceptance_rate"]) for r in spec] == [
        (5.3, 0.86), (3.55, 0.51), (4.42, 0.69), (5.51, 0.9),
    ]  # fmt: skip
    assert {(r["engine"], r["log_format"], r["cumulative"]) for r in spec} == {(0, "sglang", False)}
    per_rank = _rows(LOGS / "sglang-6081_dp_tp_mtp_accept_len_per_rank.log", "spec_decode")
    assert [(r["engine"], r["mean_acceptance_length"]) for r in per_rank] == [
        (0, 2.9), (6, 2.86), (5, 2.94), (7, 2.65), (2, 2.58),
    ]  # fmt: skip
    assert {r["acceptance_rate"] for r in per_rank} == {None}  # that version printed accept len only


def test_same_second_samples_keep_their_order_and_cut_columns_keep_their_fields():
    """#25960: seven prefill lines in one printed second, each cut mid-line by the terminal
    (`#cached-to…unning-req: 6`): the queue 28 → 51 → 51 → 50 → 73 → 96 → 119 in file order."""
    rows = _rows(LOGS / "sglang-25960_same_second_queue_51_to_119_terminal_cut_columns.log")
    assert [r["waiting"] for r in rows] == [28, 51, 51, 50, 73, 96, 119]
    assert [r["running"] for r in rows] == list(range(7))
    assert {r["t_s"] for r in rows} == {0.0} and [r["line"] for r in rows] == list(range(2, 9))
    t = spread_ties([r["t_s"] for r in rows])
    assert t == sorted(t) and len(set(t)) == 7 and t[-1] < 1.0


def test_a_sustained_decay_of_acceptance_is_an_sch007_finding(tmp_path):
    """No public log shows acceptance decaying over a long run: a documented synthetic log, written by Python's
    logging in SGLang's layout (`[%(asctime)s TP0] %(message)s`, configure_logger) from the real decode line of
    #36081 with the accept len/rate set to decay over 10 intervals of 5 s."""
    (line,) = [ln for ln in (LOGS / "sglang-36081_tp0_ep0_spec_accept_len_rate_healthy.log").read_text().splitlines()
               if "accept len: 5.51" in ln]  # fmt: skip
    msg = line[line.index("] ") + 2 :]
    out = tmp_path / "decay.log"
    rates = [0.90, 0.88, 0.86, 0.83, 0.80, 0.78, 0.75, 0.72, 0.70, 0.67]
    with out.open("w") as f:
        for i, r in enumerate(rates):
            m = msg.replace("accept len: 5.51, accept rate: 0.90", f"accept len: {r * 6:.2f}, accept rate: {r:.2f}")
            f.write(f"[2026-08-23 09:{10 + i // 12:02d}:{(i * 5) % 60:02d} TP0 EP0] {m}\n")
    from tracediag.analysis import analyze

    report = analyze(
        [],
        extra_inputs=[(out, "vllm-log")],
        extra_rules=["tracediag.rules.step6_scheduling.sch007_speculative_decoding"],
    )
    (c,) = [c for c in report.checks if c.rule == "SCH007"]
    assert c.status == "finding" and c.severity == "warning", c.to_dict()
    assert "decays" in c.title and c.values["n"] == 10 and c.values["window_s"] == 45.0
    assert c.values["p_decrease"] < 0.05 and c.values["sen_slope_per_s"] < 0 and c.values["drop"] >= 0.1 * 0.79
    assert [e["name"] for e in c.evidence] == ["first interval", "last interval"]
