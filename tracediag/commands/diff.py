"""`tracediag diff BEFORE AFTER`: what changed between two runs, as diff.html and diff.json."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)


def diff(
    before: Annotated[
        Path, typer.Argument(help="The earlier run: findings.json, an analyze output folder, or its traces.")
    ],
    after: Annotated[Path, typer.Argument(help="The later run, in any of the same forms.")],
    model: Annotated[
        Path | None,
        typer.Option("--model", "-m", help="Hugging Face config.json, for sides given as traces (both sides)."),
    ] = None,
    before_model: Annotated[
        Path | None, typer.Option("--before-model", help="config.json for BEFORE only (overrides --model).")
    ] = None,
    after_model: Annotated[
        Path | None, typer.Option("--after-model", help="config.json for AFTER only (overrides --model).")
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", min=1, help="Tensor-parallel degree for sides given as traces.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder for diff.html and diff.json.")] = Path(
        "tracediag-diff"
    ),
    keep_python: Annotated[bool, typer.Option("--keep-python", help="Also store python_function events.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Parallel parser processes.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Compare two runs: step time, kernel-family time, collectives, payloads, dispatch, findings."""
    from tracediag.cli import _guard

    d = _guard(
        lambda: run(
            before,
            after,
            before_model=before_model or model,
            after_model=after_model or model,
            tp=tp,
            out=out,
            keep_python=keep_python,
            jobs=jobs,
        ),
        debug,
    )
    if not quiet:
        typer.echo(f"tracediag diff: {d['before']['path']} → {d['after']['path']}")
        for line in d["headlines"] or ["no change beyond the thresholds (see the tables)"]:
            typer.echo(f"  {line}")
        typer.echo(f"report: {out}/diff.html  data: {out}/diff.json")


def run(
    before: Path,
    after: Path,
    *,
    before_model: Path | None = None,
    after_model: Path | None = None,
    tp: int | None = None,
    out: Path | None = None,
    keep_python: bool = False,
    jobs: int | None = None,
) -> dict:
    """Load (or analyse) both sides, diff them, write diff.json and diff.html into `out` when given."""
    from tracediag.checkrun import load_run
    from tracediag.errors import UsageError
    from tracediag.rundiff import diff_runs, write_diff

    if out is not None and Path(out).is_file():
        raise UsageError(f"--out {out} is a file; give a folder")
    with tempfile.TemporaryDirectory(prefix="tracediag-diff-") as tmp:
        runs = [
            load_run(p, Path(tmp) / name, model=m, tp=tp, jobs=jobs, keep_python=keep_python)
            for p, m, name in ((before, before_model, "before"), (after, after_model, "after"))
        ]
        d = diff_runs(*runs)
    if out is not None:
        try:
            write_diff(d, Path(out))
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    return d
