"""tracediag: evidence-based diagnosis of slow LLM inference."""

from __future__ import annotations

from tracediag.version import __version__

__all__ = ["__version__", "analyze", "open"]


def __getattr__(name: str):
    """`tracediag.analyze(paths, model=...)` -> Report and `tracediag.open(out_dir)` -> OpenedRun, imported on
    first use (the command line imports this package for its version only)."""
    if name == "analyze":
        from tracediag.analysis import analyze

        return analyze
    if name == "open":
        from tracediag.notebook import open_run

        return open_run
    raise AttributeError(f"module 'tracediag' has no attribute {name!r}")
