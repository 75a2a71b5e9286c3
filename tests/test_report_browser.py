"""report.html laid out by a real browser (headless Chromium, `.ci/run` installs Debian's `chromium`) at phone
width (420 px) and desktop width (1400 px): the page is never wider than the screen (wide tables scroll inside
their own box), and the verdict's headline is on the first screen.

Each page's first screen is saved as a PNG for review, in build/screenshots/ (or $TRACEDIAG_SCREENSHOTS).
The largest generated trace (`sample_traces/generate.py --large`, 2 ranks × 80 steps, 222 MB of JSON per rank)
takes minutes to make, so its check is a script, `benchmarks/report_large.py`; here the size bound is checked on a
real sample grown to 2 × 80 steps.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser import Browser, find_chromium
from conftest import REPO, SAMPLES, sample_report

from tracediag.analysis import analyze
from tracediag.reports.html import render_html

WIDTHS = (420, 1400)
SCREEN_HEIGHT = 900  # the first screen: a phone held upright, a laptop
REPORT_LIMIT = 300 * 1024  # report.html for the 2 × 80-step trace (issue: ≤ 300 KB for any trace length)
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "config.json").is_file())
SHOTS = Path(os.environ.get("TRACEDIAG_SCREENSHOTS") or REPO / "build" / "screenshots")

# Collected only where Debian's chromium is installed (tests/conftest.py says so in the pytest header);
# .ci/run installs it, so CI always runs these.
assert find_chromium() is not None


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def _render(tmp_path: Path, name: str, trace: Path, model: Path | None, report=None) -> Path:
    report = report or analyze([trace], model=model, jobs=1)  # small files: parsing in-process is faster
    page = tmp_path / f"{name}.html"
    page.write_text(render_html(report), encoding="utf-8")
    return page


def _check_layout(browser: Browser, page: Path, name: str) -> list[dict]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    out = []
    for width in WIDTHS:
        m = browser.render(page, width, SCREEN_HEIGHT, SHOTS / f"{name}_{width}.png")
        # no horizontal overflow: the page is exactly as wide as the screen (no horizontal scroll)
        assert m["scroll_width"] <= m["client_width"], (name, width, m["scroll_width"], m["wider_than_viewport"])
        assert not m["wider_than_viewport"], (name, width, m["wider_than_viewport"])
        # the verdict's headline is fully inside the first screen
        assert m["headline"] is not None, (name, width)
        assert m["headline"]["top"] >= 0 and m["headline"]["bottom"] <= SCREEN_HEIGHT, (name, width, m["headline"])
        assert m["verdict_text"].lstrip().lower().startswith("verdict"), m["verdict_text"][:80]
        # chart text is readable: at least 11 px as drawn (a phone keeps a chart 600 px wide, scrolling in its box)
        assert m["chart_text_px"] >= 11, (name, width, m["chart_text_px"])
        out.append(m)
    return out


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_reports_fit_phone_and_desktop(browser, tmp_path, name):
    d = SAMPLES / name
    page = _render(tmp_path, name, d, d / "config.json", report=sample_report(name))
    _check_layout(browser, page, name)


def test_report_without_model_names_what_could_not_run(browser, tmp_path):
    report = sample_report("delayed_rank_tp2", with_model=False)
    page = _render(tmp_path, "delayed_rank_tp2_no_model", SAMPLES / "delayed_rank_tp2", None, report=report)
    (phone, _) = _check_layout(browser, page, "delayed_rank_tp2_no_model")
    assert "--model config.json" in phone["verdict_text"]


def test_gpu_trace_and_serving_telemetry_reports_fit(browser, tmp_path):
    """Real inputs beyond the samples: an Nsight Systems export of 2 H100s (NCCL kernels, long demangled
    names) and vLLM engine logs with a /metrics scrape (time-series charts, wide stats tables)."""
    ext = REPO / "tests" / "data" / "external"
    nsys = analyze([ext / "nsys" / "nsysai_2xh100_before.sqlite"], jobs=1)
    page = tmp_path / "nsys.html"
    page.write_text(render_html(nsys), encoding="utf-8")
    _check_layout(browser, page, "nsys_2xh100")
    logs = ext / "vllm" / "log_excerpts"
    serving = analyze(
        [],
        extra_inputs=[
            (logs / "vllm-19254_v0.9.0.1_ngram_specdecode_waiting633.log", "vllm-log"),
            (logs / "vllm-5578_v0_preemption_warning_swapped_pending.log", "vllm-log"),
            (ext / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom", "prometheus"),
        ],
    )
    page = tmp_path / "serving.html"
    page.write_text(render_html(serving), encoding="utf-8")
    (phone, _) = _check_layout(browser, page, "vllm_logs_metrics")
    assert "SCH004" in phone["verdict_text"]  # KV cache full and requests preempted: the problem named


def test_a_one_mebibyte_kernel_name_stays_in_its_box(browser, tmp_path):
    """A real H100 trace whose flash-attention kernel name was grown to 1 MiB (a mutated copy): the page
    stays narrow and small, the name is cut where it is shown."""
    import gzip

    src = REPO / "tests" / "data" / "external" / "kineto" / "tracelens_h100_hf_qwen1.5-0.5b.json.gz"
    raw = gzip.decompress(src.read_bytes())
    head = b'"void pytorch_flash::flash_fwd_kernel<'
    assert head in raw
    trace = tmp_path / "huge_name.json"
    trace.write_bytes(raw.replace(head, head + b"A" * (1 << 20) + b", ", 1))
    page = _render(tmp_path, "huge_kernel_name", trace, None)
    assert page.stat().st_size < REPORT_LIMIT
    _check_layout(browser, page, "huge_kernel_name")
