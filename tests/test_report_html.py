"""report.html is self-contained and escapes untrusted text (kernel and annotation names)."""

from __future__ import annotations

import re
from dataclasses import replace

from tracediag.findings import Check
from tracediag.reports.html import render_html

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_hostile_names_are_escaped(healthy_report):
    bad = Check(
        rule="COL002",
        step=3,
        status="finding",
        title=f"payload of {HOSTILE}",
        severity="warning",
        confidence="high",
        impact=0.5,
        formula="ratio",
        substituted=HOSTILE,
        values={"kernel": HOSTILE},
        evidence=[{"rank": 0, "step": 1, "ts_ns": 5, "name": HOSTILE}],
        next_check=HOSTILE,
    )
    report = replace(healthy_report, checks=[*healthy_report.checks, bad])
    html = render_html(report)
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html


def test_self_contained(healthy_report):
    html = render_html(healthy_report)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "@import" not in html and "<link" not in html
    # walk order: step headings appear in RULEBOOK order
    positions = [html.index(f"<h3>{n}. ") for n in range(1, 7)]
    assert positions == sorted(positions)
    for rule in ("SHP001", "SHP002", "COL001", "COL002"):
        assert rule in html
