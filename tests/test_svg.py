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


def test_axes_of_a_span_that_underflows_or_overflows_a_float():
    """A vLLM log whose generation throughput read 4.9e-324 tokens/s (a denormal, from a long fuzz run) made the
    serving chart's axis take log10(0): a traceback. Such a span gets its two ends as bounds, no round steps."""
    from tracediag.reports.svg import nice_bounds, nice_ticks

    tiny = 4.9e-324
    assert nice_bounds(0.0, tiny * 1.04) == (0.0, tiny * 1.04)
    assert nice_ticks(0.0, tiny) == [0.0, tiny]
    huge = 1.7e308
    assert nice_bounds(-huge, huge) == (-huge, huge) and nice_ticks(-huge, huge) == [-huge, huge]
    assert nice_bounds(0.0, 10.0) == (0.0, 10.0) and nice_ticks(0.0, 10.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
