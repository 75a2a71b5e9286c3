"""Shared fixtures: paths to the committed sample traces and the vendored external real inputs."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
# Real inputs from outside the project (HolisticTraceAnalysis, TraceLens, nsys-ai, pipit, vLLM and SGLang
# threads...), vendored with their source and licence: tests/data/external/README.md.
EXTERNAL = REPO / "tests" / "data" / "external"
KINETO_DATA = EXTERNAL / "kineto"


def kineto_file(name: str) -> Path:
    p = KINETO_DATA / name
    if not p.exists():
        raise FileNotFoundError(f"{p} missing (vendored real traces: tests/data/external/README.md)")
    return p


def _chromium() -> str | None:
    from browser import find_chromium

    return find_chromium()


# The headless-browser tests need Debian's chromium (`apt-get install chromium`; .ci/run installs it). Where it
# is missing they are not collected — never reported as passed or skipped — and the header says so.
collect_ignore = [] if _chromium() else ["test_report_browser.py"]


def pytest_report_header(config):
    where = _chromium()
    return [f"headless-browser tests: {'chromium at ' + where if where else 'NOT collected (no chromium on PATH)'}"]


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from this run")


@pytest.fixture(scope="session")
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def healthy_report():
    from tracediag.analysis import analyze

    d = SAMPLES / "healthy_tp2"
    return analyze([d], model=d / "config.json")


@functools.cache
def sample_report(name: str, with_model: bool = True):
    """One analysis per sample per pytest run (jobs=1: small files parse faster in-process)."""
    from tracediag.analysis import analyze

    d = SAMPLES / name
    return analyze([d], model=d / "config.json" if with_model else None, jobs=1)
