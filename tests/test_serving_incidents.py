"""Serving verdicts on real telemetry: a closed-loop benchmark is a caveat beside the findings it qualifies, never
the headline; a growing queue on a valid load heads the verdict (RULEBOOK, verdict section); deaths, hangs and idle
engines in real SGLang and vLLM logs (SCH011) are told apart, each counted from the file itself."""

from __future__ import annotations

import importlib

import pytest
from conftest import REPO

from tracediag.context import Context, Settings
from tracediag.engine import run_rules
from tracediag.findings import verdict
from tracediag.pipeline import build_store
from tracediag.rules import RULE_MODULES

EXTERNAL = REPO / "tests" / "data" / "external"
SGLANG_LOGS = EXTERNAL / "sglang" / "log_excerpts"
VLLM_LOGS = EXTERNAL / "vllm" / "log_excerpts"
BENCH = EXTERNAL / "vllm" / "bench"
SERVING = [importlib.import_module(m) for m in RULE_MODULES if m.rpartition(".")[2].startswith("sch")]


def _checks(*inputs):
    con = build_store(list(inputs))
    try:
        return run_rules(Context(con=con, model=None, tp=None, settings=Settings()), SERVING)
    finally:
        con.close()


def _by_rule(checks):
    return {c.rule: c for c in checks}


def test_closed_loop_benchmark_is_a_caveat_not_the_verdict():
    """`vllm bench serve --max-concurrency 4` at rate inf: a closed loop. It qualifies capacity claims (caveat) and
    heads nothing; SCH002's finding on the same file stands on its own, not folded under SCH009."""
    checks = _checks((BENCH / "vllm-0.33.0_cap4_save-detailed.json", "vllm-bench"))
    c = _by_rule(checks)
    assert c["SCH009"].status == "finding" and c["SCH009"].severity == "info"
    assert c["SCH009"].values["caveat"] is True and "SCH003" in c["SCH009"].qualifies
    assert "SCH009" not in c["SCH002"].downstream_of
    v = verdict(checks)
    assert v.get("rule") != "SCH009"
    assert [x["rule"] for x in v["caveats"]] == ["SCH009"]
    assert all(a["rule"] != "SCH009" for a in v.get("also", []))


def test_queue_growth_heads_the_verdict_on_a_valid_load():
    """An SGLang log whose queue grows 51 -> 119 (SCH003 error) beside a closed-loop benchmark: the caveat does not
    invalidate the load, so the queue is named first."""
    checks = _checks(
        (SGLANG_LOGS / "sglang-25960_same_second_queue_51_to_119_terminal_cut_columns.log", "sglang-log"),
        (BENCH / "vllm-0.33.0_cap4_save-detailed.json", "vllm-bench"),
    )
    v = verdict(checks)
    assert v["status"] == "problem" and v["rule"] == "SCH003", v
    assert v["caveats"][0]["rule"] == "SCH009" and "SCH003" in v["caveats"][0]["qualifies"]
    assert v.get("second") is None or v["second"]["rule"] != "SCH003"


def _sch011(path, fmt):
    (c,) = [c for c in _checks((path, fmt)) if c.rule == "SCH011"]
    return c


def _lines_matching(path, text):
    return [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if text in line]


# (file, the kind of the cause, the text its line carries) — the cause's line number is counted from the file
DEATHS = [
    (SGLANG_LOGS / "sglang-3837_access_200_then_nccl_backtrace_segfault.log", "sglang-log", "fatal_signal",
     "Fatal Python error: Segmentation fault"),
    (SGLANG_LOGS / "sglang-10407_decode_batch_then_tp3_scheduler_exception_indented.log", "sglang-log",
     "scheduler_exception", "Scheduler hit an exception"),
    (SGLANG_LOGS / "sglang-10216_nccl_dump_signal_then_fatal_python_error_aborted.log", "sglang-log",
     "collective_timeout", "Received a dump signal due to a collective timeout"),
    (VLLM_LOGS / "vllm-25032_v1_flash_attn_cuda_error_then_worker_proc_died.log", "vllm-log", "device_error",
     "CUDA error ("),
    (VLLM_LOGS / "vllm-43605_rocm_memory_access_fault_worker_tp_ep.log", "vllm-log", "device_error",
     "Memory access fault by GPU node-"),
    # the API server's "failed (engine dead)" lines come first in the file; the worker's CUDA error is the cause
    (VLLM_LOGS / "vllm-23814_v1_engine_dead_500s_shutdown_custom_allreduce_illegal_memory.log", "vllm-log",
     "device_error", "Failed: Cuda error"),
    (VLLM_LOGS / "vllm-30579_v1_worker_died_then_tcpstore_recvvalue_other_rank.log", "vllm-log", "worker_died",
     "died unexpectedly"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "fmt", "kind", "text"), DEATHS, ids=[d[0].name for d in DEATHS])
def test_a_process_death_is_an_error_naming_its_first_cause(path, fmt, kind, text):
    c = _sch011(path, fmt)
    assert c.status == "finding" and c.severity == "error", c.title
    assert c.title.startswith("Server process died")
    assert c.values["cause_kind"] == kind
    assert c.values["cause_line"] == _lines_matching(path, text)[0]
    assert c.evidence[0]["line"] == c.values["cause_line"] and c.evidence[0]["name"] == f"cause: {kind}"


def test_cascade_lines_are_consequences_and_counted():
    path = VLLM_LOGS / "vllm-30579_v1_worker_died_then_tcpstore_recvvalue_other_rank.log"
    c = _sch011(path, "vllm-log")
    assert c.values["cascade_lines"] == len(_lines_matching(path, "recvValue failed on SocketImpl")) >= 1
    assert "cascade line(s) from the other ranks" in c.title


def test_a_log_of_cascade_lines_alone_points_at_another_rank():
    path = SGLANG_LOGS / "sglang-20859_tp16_tcpstore_connection_reset_should_dump_cascade.log"
    c = _sch011(path, "sglang-log")
    assert c.severity == "error" and "another rank's log" in c.title
    assert c.values["cascade_lines"] == sum(
        len(_lines_matching(path, t)) for t in ('Failed to check the "should dump" flag', "recvValue failed on")
    )


def test_a_health_check_failure_names_the_heartbeat_gap():
    c = _sch011(SGLANG_LOGS / "sglang-10856_health_check_failed_last_heartbeat_503.log", "sglang-log")
    assert c.severity == "error" and c.title.startswith("Server hung")
    assert c.values["heartbeat_gap_s"] == (48 * 60 + 14) - (42 * 60 + 53)  # 05:48:14 − 05:42:53


def test_a_soft_watchdog_dump_while_decoding_is_info():
    c = _sch011(SGLANG_LOGS / "sglang-20766_dp_controller_watchdog_pyspy_dump_while_decoding.log", "sglang-log")
    assert c.severity == "info" and c.values["watchdog_dumps"] == 1


@pytest.mark.parametrize(
    "name",
    [
        "sglang-17392_dp_tp_ep_pd_decode_uneven_running.log",  # DP engines, uneven running: none stalled
        "sglang-20766_dp8_to_dp15_balanced_decode.log",  # 8 engines stop at one second and the excerpt ends
        "sglang-10053_healthy_low_load.log",
        "sglang-36081_tp0_ep0_spec_accept_len_rate_healthy.log",
    ],
)
def test_healthy_sglang_logs_have_no_stall(name):
    assert _sch011(SGLANG_LOGS / name, "sglang-log").status == "pass"


def test_interval_averaged_sglang_throughput_is_not_a_stall(tmp_path):
    """SGLang prints `gen throughput` averaged since its previous decode line: three lines at 0.15 tok/s after an
    idle stretch are 40 decode passes each, progress. The real line of sglang-10053, its throughput field set low
    (a mutation of a real file, like the fuzz tests')."""
    real = (SGLANG_LOGS / "sglang-10053_healthy_low_load.log").read_text(encoding="utf-8").splitlines()
    decode = [line for line in real if "Decode batch" in line and "gen throughput" in line]
    assert len(decode) >= 3
    import re

    slow = [re.sub(r"gen throughput \(token/s\): [\d.]+", "gen throughput (token/s): 0.15", line) for line in decode]
    p = tmp_path / "sglang_idle_gaps.log"
    p.write_text("\n".join(slow) + "\n", encoding="utf-8")
    assert _sch011(p, "sglang-log").status == "pass"


def _composed_hang(tmp_path, end_line):
    """No public log holds both a frozen DP server's last lines and what ended the silence: the 8 real decode lines
    of sglang-20766 (8 engines, 12 running each, one second), then a real later line re-timed 44 minutes on."""
    real = (SGLANG_LOGS / "sglang-20766_dp8_to_dp15_balanced_decode.log").read_text(encoding="utf-8")
    p = tmp_path / "hang.log"
    p.write_text(real.rstrip("\n") + "\n" + end_line + "\n", encoding="utf-8")
    return p


def test_a_whole_frozen_server_ended_by_a_health_check_failure_is_a_hang(tmp_path):
    hc = (SGLANG_LOGS / "sglang-10856_health_check_failed_last_heartbeat_503.log").read_text().splitlines()[0]
    line = "[2026-03-17 18:19:07" + hc[hc.index("]") :].replace(
        "last_heartbeat time: 05:42:53", "last_heartbeat time: 17:35:07"
    )
    c = _sch011(_composed_hang(tmp_path, line), "sglang-log")
    assert c.status == "finding" and c.severity == "error" and c.title.startswith("Server hung")
    assert c.values["hang_s"] == 44 * 60
    assert c.values["engines_hung"] == 8 and c.values["running_at_hang"] == 8 * 12
    assert c.values["hang_start"] == "2026-03-17 17:35:07" and c.values["hang_end_kind"] == "health_check_failed"


def test_all_engines_stopping_together_then_a_later_line_is_a_hang(tmp_path):
    access = (SGLANG_LOGS / "sglang-10856_health_check_failed_last_heartbeat_503.log").read_text().splitlines()[1]
    line = "[2026-03-17 18:19:07" + access[access.index("]") :]
    c = _sch011(_composed_hang(tmp_path, line), "sglang-log")
    assert c.severity == "error" and c.values["engines_hung"] == 8 and c.values["hang_s"] == 44 * 60


def test_an_accept_length_of_one_under_python_logging_is_read_and_is_a_finding(tmp_path):
    """SGLang under an application's Python logging (`2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.
    scheduler_metrics_mixin: Decode batch, …`, the real sglang-omni #712 log) with the `accept len: 1.00, accept
    rate: 0.00` fields a speculative server prints (their place and form as in the real sglang-36081 lines): no
    draft accepted. It was read, and passed as "yields 1.00 tokens per round: it pays while a round costs < 1.00
    decode steps", which no round can."""
    src = (SGLANG_LOGS / "sglang-omni-712_python_logging_layout_scheduler_metrics_mixin.log").read_text()
    spec = ", accept len: 1.00, accept rate: 0.00, cuda graph"
    lines = [ln.replace(", cuda graph", spec) if "Decode batch" in ln else ln for ln in src.splitlines()]
    f = tmp_path / "python_logging_accept_len_1.log"
    f.write_text("\n".join(lines) + "\n")
    c = _by_rule(_checks((f, "sglang-log")))["SCH007"]
    assert c.status == "finding" and c.severity == "warning"
    assert c.values["expected_tokens_per_round"] == 1.0 and "1.00 tokens per round" in c.title
