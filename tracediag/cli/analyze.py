"""`tracediag analyze`: ingest, derive, run every rule, write report.html, findings.json and trace.duckdb."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli import options as opt


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)


def analyze(
    inputs: opt.Inputs = None,
    model: opt.Model = None,
    tp: opt.Tp = None,
    store: opt.Store = None,
    ranks: opt.Ranks = None,
    scheduler: opt.Scheduler = None,
    out: Annotated[
        str,
        typer.Option("--out", "-o", metavar="DIR", help="Output folder for report.html, findings.json, trace.duckdb."),
    ] = "tracediag-out",
    force: opt.Force = False,
    keep_python: opt.KeepPython = False,
    jobs: opt.Jobs = None,
    memory_limit: opt.MemoryLimit = None,
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
    config: opt.Config = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    fmt: opt.FindingsFormat = "text",
    show_progress: opt.Progress = None,
    debug: opt.Debug = False,
) -> None:
    """Ingest traces and telemetry, run the rules, write report.html, findings.json and trace.duckdb.

    \b
    Examples:
      tracediag analyze traces/ --model config.json
      tracediag analyze rank0.json.gz rank1.json.gz -m config.json --tp 2 -o incident-123/
      tracediag analyze --store incident-123.store -m config.json
      tracediag analyze --log server.log --metrics metrics.prom --bench result.json --slo ttft=500,tpot=50
      tracediag analyze traces/ -m config.json --format json | jq .verdict

    Settings a tracediag.toml gives (slo, hbm_bandwidth_gbs, peak_tflops, tp1_baseline, graph_capture and the
    tolerances; found from the current folder up, or --config) apply where no option gives the same.
    """
    from tracediag.analysis import run as run_analysis
    from tracediag.cli import _guard, cli_request, emit_json
    from tracediag.cli.progress import progress, wanted
    from tracediag.files import OutputGuard
    from tracediag.output import staged_outputs

    given = dict(inputs=inputs, model=model, tp=tp, ranks=ranks, keep_python=keep_python, jobs=jobs,
                 memory_limit=memory_limit, metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests,
                 topology=topology, hbm_bandwidth=hbm_bandwidth, peak_tflops=peak_tflops, slo=slo,
                 tp1_baseline=tp1_baseline, graph_capture=graph_capture)  # fmt: skip
    out_dir = Path(out)

    def run():
        nonlocal out_dir
        opt.output_format(fmt)
        out_dir = opt.output_path(out, "--out")
        request = cli_request(given, config=config, store=store, scheduler=scheduler)
        guard = OutputGuard.of(request.read_paths(), force=force)
        with progress(enabled=wanted(show_progress, quiet)) as say:
            produce = lambda staging: run_analysis(request, staging / "trace.duckdb", progress=say)  # noqa: E731
            report = staged_outputs(out_dir, produce, guard=guard)
            say("writing report.html and findings.json")
            return report

    report = _guard(run, debug)
    if fmt == "json":  # the file as written, byte for byte
        emit_json((out_dir / "findings.json").read_bytes())
    elif not quiet:
        from tracediag.reports.terminal import print_summary  # rich: only for the summary

        print_summary(report, out_dir)
