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
    hbm_bandwidth: Annotated[
        float | None,
        typer.Option(
            "--hbm-bandwidth", min=0.001, max=100_000, metavar="GB/S", help="GPU memory bandwidth, GB/s (> 0, ≤ 1e5)."
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None,
        typer.Option(
            "--peak-tflops", min=0.001, max=100_000, metavar="TF/S", help="GPU dense peak, TFLOP/s (> 0, ≤ 100000)."
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option("--slo", metavar="BUDGETS", help="Latency budgets in ms, e.g. ttft=500,tpot=50,e2el=10000."),
    ] = None,
    tp1_baseline: Annotated[
        Path | None, typer.Option("--tp1-baseline", metavar="TRACE", help="A TP=1 trace of the same model.")
    ] = None,
    graph_capture: Annotated[
        Path | None,
        typer.Option(
            "--graph-capture",
            metavar="TRACE",
            help="The trace of the CUDA/HIP graph capture beside its replay: replayed kernels get their capturing ops.",
        ),
    ] = None,
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
    """
    from tracediag.analysis import analyze as run_analysis
    from tracediag.cli import _guard, emit_json, extra_inputs_from, memory_budget
    from tracediag.cli.progress import progress, wanted
    from tracediag.context import Settings, parse_slo
    from tracediag.files import OutputGuard
    from tracediag.output import staged_outputs

    extra = extra_inputs_from(metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests, topology=topology)

    def produce(staging: Path, say, budget: int | None):
        settings = Settings(
            hbm_bandwidth_gbs=hbm_bandwidth,
            peak_tflops=peak_tflops,
            slo_ms=parse_slo(slo),
            tp1_baseline=str(tp1_baseline) if tp1_baseline else None,
            graph_capture=str(graph_capture) if graph_capture else None,
        )
        return run_analysis(
            inputs or [],
            model=model,
            tp=tp,
            db_path=staging / "trace.duckdb",
            keep_python=keep_python,
            jobs=jobs,
            settings=settings,
            extra_inputs=extra,
            store=store,
            progress=say,
            ranks=ranks,
            scheduler=scheduler,
            memory_limit=budget,
        )

    out_dir = Path(out)

    def run():
        nonlocal out_dir
        opt.output_format(fmt)
        out_dir = opt.output_path(out, "--out")
        budget = memory_budget(memory_limit)
        guard = OutputGuard.of(inputs, model, tp1_baseline, graph_capture, store, [p for p, _ in extra], force=force)
        with progress(enabled=wanted(show_progress, quiet)) as say:
            report = staged_outputs(out_dir, lambda staging: produce(staging, say, budget), guard=guard)
            say("writing report.html and findings.json")
            return report

    report = _guard(run, debug)
    if fmt == "json":  # the file as written, byte for byte
        emit_json((out_dir / "findings.json").read_bytes())
    elif not quiet:
        from tracediag.reports.terminal import print_summary  # rich: only for the summary

        print_summary(report, out_dir)
