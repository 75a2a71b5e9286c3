"""`tracediag check`: the rules in CI. Exit 0 when nothing at or above --fail-on is new, 1 when something
is, 2 on usage or input errors (one line on stderr), 3 on an internal error, 4 when the check is inconclusive
(nothing failed, but a required rule could not run or the run cannot be diagnosed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli import options as opt


def register(app: typer.Typer) -> None:
    app.command("check")(check)


FailOnOption = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="LEVEL",
        help="Lowest severity that fails: info, warning or error (config: fail_on; default warning).",
    ),
]

BaselineOption = Annotated[
    Path | None,
    typer.Option(
        "--baseline",
        metavar="RUN",
        help="A previous run: its findings.json (or analyze output folder), or its traces. Only new or "
        "worsened findings and regressed key measures fail.",
    ),
]

JunitOption = Annotated[
    str | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML here (one test case per rule).")
]

AnnotatedTraceOption = Annotated[
    str | None,
    typer.Option(
        "--annotated-trace",
        metavar="FILE",
        help="Write a Chrome-trace JSON with each finding marked (Perfetto UI).",
    ),
]

RulesOption = Annotated[
    str | None,
    typer.Option("--rules", metavar="GLOBS", help="Rules to run: ids or globs, e.g. 'COL*,SHP001' (config: rules)."),
]

RequireOption = Annotated[
    str | None,
    typer.Option(
        "--require",
        metavar="GLOBS",
        help="Rules that must run, e.g. 'SHP*,COL*': one that could not run (a missing input) makes the "
        "check inconclusive, exit 4 (config: require).",
    ),
]

OutOption = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        metavar="DIR",
        help="Also write report.html, findings.json, trace.duckdb and check.json here.",
    ),
]


def check(
    inputs: opt.Inputs = None,
    model: opt.Model = None,
    tp: opt.Tp = None,
    store: opt.Store = None,
    ranks: opt.Ranks = None,
    scheduler: opt.Scheduler = None,
    fail_on: FailOnOption = None,
    baseline: BaselineOption = None,
    junit: JunitOption = None,
    annotated_trace: AnnotatedTraceOption = None,
    rules: RulesOption = None,
    require: RequireOption = None,
    config: opt.Config = None,
    out: OutOption = None,
    force: opt.Force = False,
    metrics: opt.Metrics = None,
    log: opt.Log = None,
    bench: opt.Bench = None,
    nccl_tests: opt.NcclTests = None,
    topology: opt.Topology = None,
    hbm_bandwidth: opt.HbmBandwidth = None,
    peak_tflops: opt.PeakTflops = None,
    slo: opt.Slo = None,
    tp1_baseline: opt.Tp1Baseline = None,
    graph_capture: opt.GraphCapture = None,
    keep_python: opt.KeepPython = False,
    jobs: opt.Jobs = None,
    memory_limit: opt.MemoryLimit = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the verdict line.")] = False,
    fmt: opt.CheckFormat = "text",
    show_progress: opt.Progress = None,
    debug: opt.Debug = False,
) -> None:
    """Run the rules as a CI gate: exit 1 when a finding at or above --fail-on is new (vs --baseline).

    Exit status: 0 passed; 1 failed (something new at or above --fail-on); 2 usage or input error; 3 internal
    error; 4 inconclusive (nothing failed, but a --require rule could not run, or no selected rule could run
    or the trace is unfit for diagnosis).

    \b
    Examples:
      tracediag check traces/ -m config.json --junit rules.xml
      tracediag check traces/ -m config.json --baseline last-good/findings.json --fail-on error
      tracediag check traces/ -m config.json --rules 'COL*,SHP001' --annotated-trace marked.json
      tracediag check traces/ -m config.json --require 'SHP*,COL*'
      tracediag check traces/ -m config.json --format json > check.json
    """
    from tracediag.cli import _guard, cli_request, emit_json
    from tracediag.cli.progress import progress, wanted
    from tracediag.gate.run import run_check

    given = dict(inputs=inputs, model=model, tp=tp, ranks=ranks, keep_python=keep_python, jobs=jobs,
                 memory_limit=memory_limit, metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests,
                 topology=topology, hbm_bandwidth=hbm_bandwidth, peak_tflops=peak_tflops, slo=slo,
                 tp1_baseline=tp1_baseline, graph_capture=graph_capture)  # fmt: skip
    paths = {}

    def run():
        opt.output_format(fmt)
        paths.update(
            junit=opt.output_path(junit, "--junit"),
            annotated_trace=opt.output_path(annotated_trace, "--annotated-trace"),
            out=opt.output_path(out, "--out"),
        )
        request = cli_request(given, config=config, store=store, scheduler=scheduler)
        with progress(enabled=wanted(show_progress, quiet)) as say:
            return run_check(request, fail_on=fail_on, baseline=baseline, rules=rules, require=require, force=force,
                             **paths, progress=say)  # fmt: skip

    result, warnings = _guard(run, debug)
    for w in warnings:
        typer.echo(f"tracediag: warning: {w}", err=True)
    if fmt == "json":
        from tracediag.gate.run import check_json

        emit_json(check_json(result))
    else:
        from tracediag.gate.text import print_result

        print_result(result, quiet=quiet, **paths)
    raise typer.Exit(result.exit_code)
