"""`tracediag diff BEFORE AFTER`: what changed between two runs, as diff.html and diff.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli import options as opt

EXIT_NOT_COMPARABLE = 1  # as `git diff --exit-code` says "they differ": 0 comparable, 2 usage/input, 3 internal


def _side_input(flag: str, what: str, side: str):
    return typer.Option(
        flag, metavar="FILE", help=f"{what} of {side}, read with its traces (as analyze --{flag.split('-')[-1]})."
    )


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)


ModelOption = Annotated[
    Path | None,
    typer.Option(
        "--model", "-m", metavar="FILE", help="Hugging Face config.json, for sides given as traces (both sides)."
    ),
]

BeforeModelOption = Annotated[
    Path | None,
    typer.Option("--before-model", metavar="FILE", help="config.json for BEFORE only (overrides --model)."),
]

AfterModelOption = Annotated[
    Path | None,
    typer.Option("--after-model", metavar="FILE", help="config.json for AFTER only (overrides --model)."),
]

TpOption = Annotated[
    int | None,
    typer.Option(
        "--tp", min=1, max=4096, metavar="N", help="Tensor-parallel degree (1 to 4096) for sides given as traces."
    ),
]

OutOption = Annotated[
    str, typer.Option("--out", "-o", metavar="DIR", help="Output folder for diff.html and diff.json.")
]

ForceCompareOption = Annotated[
    bool,
    typer.Option(
        "--force-compare",
        help="Report the changes even when the runs are not comparable (another model, layout, GPU, step "
        "shape or load); the verdict still says why they are not.",
    ),
]

BeforeBenchOption = Annotated[
    list[Path] | None, _side_input("--before-bench", "`vllm bench serve` result JSON", "BEFORE")
]

AfterBenchOption = Annotated[list[Path] | None, _side_input("--after-bench", "`vllm bench serve` result JSON", "AFTER")]


def diff(
    before: Annotated[
        Path,
        typer.Argument(
            metavar="BEFORE", help="The earlier run: findings.json, an analyze output folder, or its traces."
        ),
    ],
    after: Annotated[Path, typer.Argument(metavar="AFTER", help="The later run, in any of the same forms.")],
    model: ModelOption = None,
    before_model: BeforeModelOption = None,
    after_model: AfterModelOption = None,
    tp: TpOption = None,
    out: OutOption = "tracediag-diff",
    force: opt.Force = False,
    force_compare: ForceCompareOption = False,
    keep_python: Annotated[bool, typer.Option("--keep-python", help="Also store python_function events.")] = False,
    jobs: opt.Jobs = None,
    memory_limit: opt.MemoryLimit = None,
    before_log: Annotated[list[Path] | None, _side_input("--before-log", "vLLM engine/server logs", "BEFORE")] = None,
    after_log: Annotated[list[Path] | None, _side_input("--after-log", "vLLM engine/server logs", "AFTER")] = None,
    before_metrics: Annotated[list[Path] | None, _side_input("--before-metrics", "/metrics scrapes", "BEFORE")] = None,
    after_metrics: Annotated[list[Path] | None, _side_input("--after-metrics", "/metrics scrapes", "AFTER")] = None,
    before_bench: BeforeBenchOption = None,
    after_bench: AfterBenchOption = None,
    config: opt.Config = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    fmt: opt.DiffFormat = "text",
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Compare two runs: step time, kernel-family time, collectives, payloads, dispatch, findings.

    First it fingerprints both runs (model, TP/EP/DP layout, GPU, engine, step shapes, serving load, trace
    fitness) and says which differ; runs that differ in the work itself are "not comparable" and no change
    is reported unless --force-compare is given. Per-op efficiency (% of each GPU's own roofline) is
    compared across GPUs all the same.

    Serving inputs (--before-log, --after-metrics, ...), --memory-limit and the settings of tracediag.toml
    (found from the current folder up, or --config) apply to sides given as traces; an analysed run
    (findings.json, output folder) already holds what it was analysed with.

    Exit status: 0 the runs are comparable; 1 they are not (with or without --force-compare); 2 a usage or
    input error; 3 an internal error.

    \b
    Examples:
      tracediag diff last-good/ incident-123/
      tracediag diff before-traces/ after-traces/ -m config.json -o diff-out/
      tracediag diff tp2-run/ tp4-run/ --force-compare
    """
    from tracediag.cli import _guard, extra_inputs_from
    from tracediag.cli.progress import progress
    from tracediag.diff import DIFF_OUTPUT_NAMES, run_diff
    from tracediag.files import OutputGuard

    def run():
        opt.output_format(fmt)
        out_dir = opt.output_path(out, "--out")
        sides = {
            "before": extra_inputs_from(log=before_log, metrics=before_metrics, bench=before_bench),
            "after": extra_inputs_from(log=after_log, metrics=after_metrics, bench=after_bench),
        }
        extra = [p for side in sides.values() for p, _ in side]
        guard = OutputGuard.of(before, after, model, before_model, after_model, extra, force=force)
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
                memory_limit=memory_limit,
                before_inputs=sides["before"],
                after_inputs=sides["after"],
                config=config if config is not None else True,
                naming="cli",
            )

    d = _guard(run, debug)
    if fmt == "json":
        from tracediag.cli import emit_json
        from tracediag.diff.render import diff_json

        emit_json(diff_json(d))
    elif not quiet:  # typer.echo never wraps: one line per headline in CI logs
        from tracediag.diff.render import terminal_lines

        for line in terminal_lines(d):
            typer.echo(line)
        typer.echo(f"report: {out}/diff.html  data: {out}/diff.json")
    if not d["comparability"]["comparable"]:  # forced or not: the verdict is the status
        raise typer.Exit(EXIT_NOT_COMPARABLE)
