"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): one browser
process for many pages, no network, no Python dependency.

Used by tests/test_report_browser.py to lay report.html out at a given viewport width, measure it (page
width against the viewport, where the verdict is) and take a screenshot. Nothing is injected into the page:
the measurement runs as a DevTools `Runtime.evaluate` in the page after it loaded.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

# Flags: headless without a sandbox or GPU (containers), and nothing that reaches out to the network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--mute-audio",
)

MEASURE_JS = """
(() => {
  const de = document.documentElement;
  const v = document.getElementById('verdict');
  const h = document.getElementById('verdict-headline');
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.right > de.clientWidth + 1 && !el.closest('.scroll')) {
      wide.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + ' right=' + Math.round(r.right));
      if (wide.length > 5) break;
    }
  }
  const box = (el) => {
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right};
  };
  return JSON.stringify({
    viewport_width: window.innerWidth, viewport_height: window.innerHeight,
    client_width: de.clientWidth, scroll_width: de.scrollWidth, body_scroll_width: document.body.scrollWidth,
    page_height: de.scrollHeight, verdict: box(v), headline: box(h), wider_than_viewport: wide,
    verdict_text: v ? v.innerText : null,
    // the smallest chart text as drawn: 12 viewBox units scaled by the chart's rendered width over its viewBox
    chart_text_px: Math.min(...[...document.querySelectorAll('.chart svg')].map(
      (s) => 12 * s.getBoundingClientRect().width / (s.viewBox.baseVal.width || 640)), 99),
  });
})()
"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, binary: str | None = None, timeout_s: float = 60.0) -> None:
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH")
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="tracediag-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: the protocol pipe is fd 3 (commands in) and fd 4 (replies out)
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)  # dup2 makes them inheritable; every other fd of ours is not (PEP 446)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=wire,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []

    # --- protocol -------------------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None = None, sid: str | None = None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if sid:
            msg["sessionId"] = sid
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the protocol pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, sid: str | None = None) -> dict[str, Any]:
        want = self._send(method, params, sid)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._events.append(msg)

    def wait_event(self, method: str, sid: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        for i, ev in enumerate(self._events):
            if ev.get("method") == method and ev.get("sessionId") == sid:
                return self._events.pop(i)
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method and msg.get("sessionId") == sid:
                return msg
            self._events.append(msg)

    # --- pages ----------------------------------------------------------------------------------------
    def render(
        self, page: Path, width: int, height: int, screenshot: Path | None = None, full_page: bool = False
    ) -> dict[str, Any]:
        """Lay `page` out in a width × height viewport; returns the measurements, writes a PNG when asked
        (the first screen, or with `full_page` the whole page at that width)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            self.call("Page.enable", sid=sid)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
                sid=sid,
            )
            self._events.clear()
            self.call("Page.navigate", {"url": page.resolve().as_uri()}, sid=sid)
            self.wait_event("Page.loadEventFired", sid)
            res = self.call("Runtime.evaluate", {"expression": MEASURE_JS, "returnByValue": True}, sid=sid)
            metrics = json.loads(res["result"]["value"])
            if screenshot is not None:
                params: dict[str, Any] = {"format": "png"}
                if full_page:
                    clip = {"x": 0, "y": 0, "width": width, "height": metrics["page_height"], "scale": 1}
                    params |= {"captureBeyondViewport": True, "clip": clip}
                shot = self.call("Page.captureScreenshot", params, sid=sid)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            return metrics
        finally:
            self.call("Target.closeTarget", {"targetId": target})

    def shot_region(self, page: Path, width: int, first: str, last: str | None, png: Path, height: int = 900) -> None:
        """A PNG of the page at `width` from the element `first` (a CSS selector) to the end of `last` (for the
        committed screenshots in docs/)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            self.call("Page.enable", sid=sid)
            metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600}
            self.call("Emulation.setDeviceMetricsOverride", metrics, sid=sid)
            self._events.clear()
            self.call("Page.navigate", {"url": page.resolve().as_uri()}, sid=sid)
            self.wait_event("Page.loadEventFired", sid)
            js = (
                f"(() => {{ const a = document.querySelector({json.dumps(first)}).getBoundingClientRect();"
                f" const b = document.querySelector({json.dumps(last or first)}).getBoundingClientRect();"
                " return JSON.stringify([a.top + window.scrollY, b.bottom + window.scrollY]); })()"
            )
            res = self.call("Runtime.evaluate", {"expression": js, "returnByValue": True}, sid=sid)
            top, bottom = json.loads(res["result"]["value"])
            clip = {"x": 0, "y": max(0, top - 8), "width": width, "height": bottom - top + 16, "scale": 1}
            shot = self.call(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip},
                sid=sid,
            )
            png.write_bytes(base64.b64decode(shot["data"]))
        finally:
            self.call("Target.closeTarget", {"targetId": target})

    def close(self) -> None:
        try:
            self._send("Browser.close")
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                with contextlib.suppress(OSError):
                    os.close(fd)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
