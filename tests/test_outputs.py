"""What people and programs read: units and labels in words, the report's size bound, the notebook API, the
store's column comments, the annotated trace (gzip, the input's thread names, size) and the terminal summary."""

from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import replace

import duckdb
import pytest
from conftest import SAMPLES, sample_report
from typer.testing import CliRunner

import tracediag
from tracediag.reports import units
from tracediag.reports.html import render_html, select_rows
from tracediag.reports.sections import Section
from tracediag.reports.terminal import make_console, print_summary
from tracediag.rules import RULE_MODULES

NB = "\u00a0"


# --- units ----------------------------------------------------------------------------------------------------


def test_units_people_read():
    assert units.duration(26_415_087) == f"26.4{NB}ms"
    assert units.duration(850) == f"850{NB}ns" and units.duration(12_345) == f"12.3{NB}µs"
    assert units.duration(1.44e9) == f"1.44{NB}s"
    assert (
        units.size(24_576) == f"24{NB}KiB" and units.size(80 * 2**30) == f"80{NB}GiB" and units.size(512) == f"512{NB}B"
    )
    assert units.percent(0.0748) == "7.5%" and units.percent(0.65) == "65%" and units.percent(0.0042) == "0.42%"
    assert units.value_text("a_ns_per_token", 2_066_695.9) == f"2.07{NB}ms/token"  # not "2.07e+03 µs/token"
    assert units.value_text("bus_bw_gbs", 12.89) == f"12.9{NB}GB/s"
    assert units.value_text("fit_payload_range_bytes", [1024, 24576]) == f"1{NB}KiB – 24{NB}KiB"
    assert units.value_text("median_spread_ns_by_phase", {"decode": 3_202_085, "prefill": 718_980}) == (
        f"decode: 3.2{NB}ms; prefill: 719{NB}µs"
    )
    assert units.relative_ts(5_105_403_283_731_566, 5_105_403_283_000_000) == f"0.732{NB}ms"


def test_labels_in_words():
    assert units.label("gpu_span_ns") == "GPU span" and units.label("step_id") == "step"
    assert units.label("total_payload_bytes") == "total payload" and units.label("H_kv") == "H_kv"
    assert units.label("others_waiting_share") == "others waiting share"
    assert "_" not in units.label("median_lateness_ns")


def test_long_names_are_cut_with_the_full_name_on_hover():
    c = units.cell("name", "void flash_fwd_kernel<" + "A" * 5000 + ">")
    assert len(c.text) == units.NAME_CHARS and c.text.endswith("…") and c.cls == "name"
    assert c.title.startswith("void flash_fwd_kernel<") and len(c.title) < 2100
    ts = units.cell("ts_ns", 5_105_403_283_731_566, t0=5_105_403_283_000_000)
    assert ts.title == "5105403283731.566 µs in the trace file" and ts.cls == "num"


def test_steps_cut_to_the_slowest_and_most_unusual_per_phase():
    rows = [
        {"rank": 0, "step_id": i, "phase": "decode", "step_ns": 10_000 + (5_000 if i == 7 else i)} for i in range(60)
    ]
    rows += [{"rank": 0, "step_id": 60 + i, "phase": "prefill", "step_ns": 50_000 + i} for i in range(10)]
    shown, how = select_rows(rows, 12)
    assert len(shown) == 12 and "furthest from the phase median" in how
    assert any(r["step_id"] == 7 for r in shown)  # the outlier decode step is kept
    assert {r["phase"] for r in shown} == {"decode", "prefill"}
    assert all("vs_phase_median_share" in r for r in shown)


# --- the page -------------------------------------------------------------------------------------------------


def test_report_size_is_bounded_whatever_the_number_of_steps():
    """healthy_tp2's report with its steps table grown to 2 × 80 steps (its 14 real rows repeated with new step
    ids: how the page grows with trace length, without a trace that takes minutes to make)."""
    report = sample_report("healthy_tp2")
    base = len(render_html(report).encode())
    grown = []
    for s in report.sections:
        if s.id == "steps":
            rows = next(iter(s.tables.values()))
            many = [r | {"step_id": r["step_id"] + 7 * k} for k in range(12) for r in rows][:160]
            s = replace(s, tables={"steps per rank": many})
        grown.append(s)
    size = len(render_html(replace(report, sections=grown)).encode())
    assert size <= 300 * 1024 and size - base < 10_000, (base, size)


def test_one_steps_table_and_a_table_of_contents():
    html = render_html(sample_report("healthy_tp2"))
    assert html.count("<h4>steps per rank</h4>") == 1
    assert '<nav class="toc"' in html and 'href="#findings"' in html and 'href="#walk"' in html
    assert (
        html.index('id="verdict"') < html.index('id="findings"') < html.index('id="walk"') < html.index('id="inputs"')
    )
    body = re.sub(r'title="[^"]*"', "", html.split('id="inputs"')[0])
    assert not re.search(r"\d{13}\.\d{3}", body)  # no raw µs timestamps (only on hover, and t = 0 once below)
    assert "unknown phase phase" not in html and "e+03" not in html.split("<footer>")[0].split('id="walk"')[0]


def test_sections_report_their_place_and_queries():
    report = sample_report("delayed_rank_tp2")
    by_id = {s.id: s for s in report.sections}
    assert by_id["overview"].place == "overview" and len(by_id["overview"].svgs) >= 3
    assert "SELECT" in by_id["steps"].queries["steps per rank"]
    html = render_html(report)
    assert "Where step time goes, per phase" in html and "Collective time per rank" in html


# --- notebook and SQL ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    from tracediag.cli import app

    out = tmp_path_factory.mktemp("nb") / "out"
    d = SAMPLES / "delayed_rank_tp2"
    r = CliRunner().invoke(app, ["analyze", str(d), "-m", str(d / "config.json"), "-o", str(out), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    return out


def test_open_an_output_folder(out_dir):
    with tracediag.open(out_dir) as run:
        assert run.verdict["rule"] == "COL005"
        f = run.findings
        assert list(f["rule"])[:1] == ["COL005"] and {"COL003", "SCH001"} <= set(f["rule"])
        steps = run.steps
        assert len(steps) == 14 and {"rank", "step_id", "phase", "T"} <= set(steps.columns)
        assert len(run.sql("SELECT * FROM collectives WHERE op = ?", ["all_reduce"])) == 126
        cols = run.columns("collectives").set_index("column")["comment"]
        assert "input bytes" in cols["payload_bytes"]
        html = run._repr_html_()
        assert "tracediag-fragment" in html and "Rank 1 is the straggler" in html and "<script" not in html
        assert "steps" in run.section("steps")["steps per rank"].columns or len(run.section("steps")) == 1


def test_report_renders_in_jupyter():
    html = sample_report("math_decode_tp2")._repr_html_()
    assert html.startswith('<div class="tracediag-fragment">') and "KRN001" in html


def test_every_store_column_has_a_comment(out_dir):
    con = duckdb.connect(str(out_dir / "trace.duckdb"), read_only=True)
    try:
        missing = con.execute(
            "SELECT table_name || '.' || column_name FROM duckdb_columns() WHERE NOT internal AND comment IS NULL"
        ).fetchall()
        assert not missing, missing
        (ts,) = con.execute(
            "SELECT comment FROM duckdb_columns() WHERE table_name = 'kernels' AND column_name = 'ts_ns'"
        ).fetchone()
        assert ts == "GPU start, ns"
    finally:
        con.close()


# --- annotated trace ------------------------------------------------------------------------------------------


def test_annotated_trace_gzip_names_and_size(tmp_path):
    from tracediag.cli import app

    d = SAMPLES / "delayed_rank_tp2"
    out = tmp_path / "marked.json.gz"
    r = CliRunner().invoke(app, ["check", str(d), "-m", str(d / "config.json"), "--annotated-trace", str(out), "-q"])
    assert r.exit_code == 1, r.output  # the straggler fails the gate
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    inputs = sorted(d.glob("rank*.pt.trace.json.gz"))
    assert len(raw) <= sum(p.stat().st_size for p in inputs)  # gzip output vs gzip inputs
    plain = gzip.decompress(raw)
    assert len(plain) <= sum(len(gzip.decompress(p.read_bytes())) for p in inputs)  # and uncompressed
    events = json.loads(plain)["traceEvents"]
    threads = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert any("pt_gloo_runloop" in t for t in threads)  # the profiler's own thread names, kept
    procs = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert any(p.endswith("(python)") for p in procs)


# --- terminal ---------------------------------------------------------------------------------------------------


def test_terminal_summary_leads_with_the_verdict_and_never_wraps_in_a_pipe():
    buf = io.StringIO()  # not a TTY
    print_summary(sample_report("delayed_rank_tp2"), "out", console=make_console(buf))
    lines = buf.getvalue().splitlines()
    assert lines[1].startswith("Verdict: Rank 1 is the straggler")
    assert any(re.match(rf"Coverage: \d+ of {len(RULE_MODULES)} rules ran", line) for line in lines), lines
    assert any(line.startswith("    ↳ COL003") for line in lines)
    assert max(len(line) for line in lines) > 150  # one line per item, however long
    assert "\x1b[" not in buf.getvalue()


def test_a_run_shorter_than_the_heartbeat_prints_nothing_without_a_terminal():
    from tracediag.cli.progress import progress

    buf = io.StringIO()
    with progress(stream=buf) as say:  # the heartbeat's first line comes after HEARTBEAT_S (5 s)
        say("reading 2 files")
    assert buf.getvalue() == ""


def test_section_dataclass_defaults_keep_old_sections_working():
    s = Section(id="x", step=3, title="t", tables={"a": [{"k": 1}]})
    assert s.place == "walk" and s.queries == {}


def test_report_repr_is_one_line():
    """repr(report) was the dataclass's whole dump (90 kB on a real trace): now the inputs, the verdict and the
    counts on one line."""
    r = sample_report("math_decode_tp2")
    text = repr(r)
    assert "\n" not in text and len(text) < 600 and text.startswith("<Report of 2 inputs (")
    assert r.verdict["headline"][:40] in text and f"of {len(r.checks)} checks>" in text
