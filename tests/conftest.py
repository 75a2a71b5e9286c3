"""Shared fixtures: paths to the committed sample traces and the external real traces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
# External real traces (HolisticTraceAnalysis, TraceLens test data...) live beside the checkout.
SHARED = Path(os.environ.get("TRACEDIAG_SHARED", REPO.parent / "shared"))
KINETO_DATA = SHARED / "data" / "kineto"


def shared_file(name: str) -> Path:
    p = KINETO_DATA / name
    if not p.exists():
        raise FileNotFoundError(f"{p} missing: set TRACEDIAG_SHARED to the folder holding data/kineto")
    return p


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.json from this run")


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
