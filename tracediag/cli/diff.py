"""`tracediag diff BEFORE AFTER`: what changed between two runs, as diff.html and diff.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli import options as opt


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)


def diff(
    before: Annotated[
        Path,
        typer.Argument(
            metavar="BEFORE", help="The earlier run: findings.json, an analyze output folder, or its traces."
        ),
    ],
    after: Annotated[Path, typer.Argument(metavar="AFTER", help="The later run, in any of the same forms.")],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", "-m", metavar="FILE", help="Hugging Face config.json, for sides given as traces (both sides)."
        ),
    ] = None,
    before_model: Annotated[
        Path | None,
        typer.Option("--before-model", metavar="FILE", help="config.json for BEFORE only (overrides --model)."),
    ] = None,
    after_model: Annotated[
        Path | None,
        typer.Option("--after-model", metavar="FILE", help="config.json for AFTER only (overrides --model)."),
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp", min=1, max=4096, metavar="N", help="Tensor-parallel degree (1 to 4096) for sides given as traces."
        ),
    ] = None,
    out: Annotated[
        str, typer.Option("--out", "-o", metavar="DIR", help="Output folder for diff.html and diff.json.")
    ] = "tracediag-diff",
    force: opt.Force = False,
    force_compare: Annotated[
        bool,
        typer.Option(
            "--force-compare",
            help="Report the changes even when the runs are not comparable (another model, layout, GPU, step "
            "shape or load); the verdict still says why they are not.",
        ),
    ] = False,
    keep_python: Annotated[bool, typer.Option("--keep-python", help="Also store python_function events.")] = False,
    jobs: opt.Jobs = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    fmt: opt.DiffFormat = "text",
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Compare two runs: step time, kernel-family time, collectives, payloads, dispatch, findings.

    First it fingerprints both runs (model, TP/EP/DP layout, GPU, engine, step shapes, serving load, trace
    fitness) and says which differ; runs that differ in the work itself are "not comparable" and no change
    is reported unless --force-compare is given.

    \b
    Examples:
      tracediag diff last-good/ incident-123/
      tracediag diff before-traces/ after-traces/ -m config.json -o diff-out/
      tracediag diff tp2-run/ tp4-run/ --force-compare
    """
    from tracediag.cli import _guard
    from tracediag.cli.progress import progress
    from tracediag.diff import DIFF_OUTPUT_NAMES, run_diff
    from tracediag.files import OutputGuard

    def run():
        opt.output_format(fmt)
        out_dir = opt.output_path(out, "--out")
        guard = OutputGuard.of(before, after, model, before_model, after_model, force=force)
        guard.check_folder(out_dir, DIFF_OUTPUT_NAMES)
        with progress(enabled=not quiet) as say:
            say(f"reading {before} and {after}, analysing the sides given as traces, comparing")
            return run_diff(
                before,
                after,
                before_model=before_model or model,
                after_model=after_model or model,
                tp=tp,
                out=out_dir,
                keep_python=keep_python,
                jobs=jobs,
                force_compare=force_compare,
            )

    d = _guard(run, debug)
    if fmt == "json":
        from tracediag.cli import emit_json
        from tracediag.diff.render import diff_json

        emit_json(diff_json(d))
    elif not quiet:  # typer.echo never wraps: one line per headline in CI logs
        typer.echo(f"tracediag diff: {d['before']['path']} → {d['after']['path']}")
        comp = d["comparability"]
        typer.echo(f"  {comp['verdict']}")
        if not comp["comparable"] and not comp["forced"]:
            lines = ["no change is reported (pass --force-compare to compare anyway)"]
        else:
            lines = d["headlines"] or ["no change beyond the thresholds (see the tables)"]
        for line in lines:
            typer.echo(f"  {line}")
        typer.echo(f"report: {out}/diff.html  data: {out}/diff.json")
