"""Charts are inline SVG with escaped labels."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tracediag.reports.svg import histogram, scatter


def test_scatter_with_fit_is_valid_svg_and_escapes():
    svg = scatter(
        "latency <vs> payload", "bytes", "µs", {"rank 0 & 1": [(1, 2), (3, 4)]}, lines={"fit": [(0, 1), (4, 5)]}
    )
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "<vs>" not in svg and "&lt;vs&gt;" in svg and "&amp;" in svg
    assert len(root.findall(".//{http://www.w3.org/2000/svg}circle")) == 2


def test_histogram_bars():
    root = ET.fromstring(histogram("T per step", "T", [("1", 5), ("2-3", 0), ("<script>", 2)]))
    assert len(root.findall(".//{http://www.w3.org/2000/svg}rect")) == 3


def test_empty_inputs_render_nothing():
    assert scatter("t", "x", "y", {}) == "" and histogram("t", "x", []) == ""
