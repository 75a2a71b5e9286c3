"""The incident folder `tracediag capture` writes (tracediag/live/capture.py): `capture.json` (its manifest),
`traces/`, `metrics.prom` and `server.log`. Reading one is ingest's: `discover_inputs` takes such a folder as its
inputs, the files listed here."""

from __future__ import annotations

from pathlib import Path

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json")
MANIFEST = "capture.json"


def capture_inputs(folder: Path) -> list[tuple[Path, str | None]]:
    """The inputs of an incident folder: its traces, metrics and log (formats detected from content)."""
    files: list[tuple[Path, str | None]] = [
        (p, None) for p in sorted((folder / "traces").glob("*")) if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
    ]
    if (folder / "metrics.prom").is_file() and (folder / "metrics.prom").stat().st_size:
        files.append((folder / "metrics.prom", "prometheus"))
    if (folder / "server.log").is_file() and (folder / "server.log").stat().st_size:
        files.append((folder / "server.log", "vllm-log"))
    return files
