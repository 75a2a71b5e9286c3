"""report.html is self-contained and escapes untrusted text (kernel and annotation names)."""

from __future__ import annotations

import re
from dataclasses import replace

from tracediag.findings import Check
from tracediag.reports.html import DOCS_URL, render_html

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
    assert not re.search(r"""src\s*=\s*["']?(?:https?:)?//""", html)  # nothing is fetched
    assert "@import" not in html and "<link" not in html and "url(" not in html
    # the only absolute links are the reader's way to the method and the rule reference (a click, not a fetch)
    links = re.findall(r"""<a\s+href\s*=\s*["']((?:https?:)?//[^"']*)""", html)
    assert links and all(u.startswith(DOCS_URL) for u in links), links
    assert len(re.findall(r"""href\s*=\s*["']?(?:https?:)?//""", html)) == len(links)
    # walk order: step headings appear in the method's order
    positions = [html.index(f"<h3>{n}. ") for n in range(1, 7)]
    assert positions == sorted(positions)
    for rule in ("SHP001", "SHP002", "COL001", "COL002"):
        assert rule in html
