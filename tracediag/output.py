"""Writes the outputs of an analysis: findings.json, report.html and trace.duckdb, atomically."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import orjson

from tracediag.analysis import Report
from tracediag.reports.html import render_html


def findings_json(report: Report) -> bytes:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def staged_outputs(out_dir: Path, produce: Callable[[Path], Report]) -> Report:
    """Run `produce(staging_dir)` and move its files into out_dir only when it succeeds.

    Nothing is left behind on failure: the staging directory sits next to out_dir (same file system,
    so each move is an atomic rename) and is removed whatever happens. Existing files in out_dir are
    replaced one by one, each atomically.
    """
    out_dir = Path(out_dir)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=parent))
    try:
        report = produce(staging)
        (staging / "findings.json").write_bytes(findings_json(report))
        (staging / "report.html").write_text(render_html(report), encoding="utf-8")
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in staging.iterdir():
            os.replace(f, out_dir / f.name)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)
