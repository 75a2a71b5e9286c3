"""report.html of the largest generated trace, laid out in headless Chromium (not a test: the trace takes minutes
to generate). Checks what tests/test_report_browser.py checks on the samples — no horizontal overflow at 420 and
1400 px, the verdict on the first screen — plus the size bound (≤ 300 KB whatever the trace length), and writes
the screenshots.

    .venv/bin/python sample_traces/generate.py --scenario healthy_tp2 --large --out bench-work/gen
    .venv/bin/python benchmarks/report_large.py bench-work/gen [--shots build/screenshots]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from browser import Browser  # noqa: E402

from tracediag.analysis import analyze  # noqa: E402
from tracediag.reports.html import render_html  # noqa: E402

LIMIT = 300 * 1024
SCREEN_HEIGHT = 900


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--shots", type=Path, default=REPO / "build" / "screenshots")
    args = ap.parse_args()
    model = args.trace_dir / "config.json"
    report = analyze([args.trace_dir], model=model if model.is_file() else None)
    page = Path(tempfile.mkdtemp()) / "large.html"
    page.write_text(render_html(report), encoding="utf-8")
    size = page.stat().st_size
    problems = [] if size <= LIMIT else [f"report.html is {size:,} bytes > {LIMIT:,}"]
    args.shots.mkdir(parents=True, exist_ok=True)
    with Browser() as b:
        for width in (420, 1400):
            m = b.render(page, width, SCREEN_HEIGHT, args.shots / f"large_{args.trace_dir.name}_{width}.png")
            if m["scroll_width"] > m["client_width"] or m["wider_than_viewport"]:
                problems.append(f"{width} px: horizontal overflow ({m['wider_than_viewport']})")
            h = m["headline"]
            if h is None or h["top"] < 0 or h["bottom"] > SCREEN_HEIGHT:
                problems.append(f"{width} px: the verdict headline is not on the first screen ({h})")
    print(f"report.html {size / 1024:,.1f} KiB; screenshots in {args.shots}")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
