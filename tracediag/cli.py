"""Command line: parses options, calls the library, picks a renderer. Errors users can fix are one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tracediag import __version__
from tracediag import cli_options as opt
from tracediag.errors import TracediagError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Why is this LLM inference deployment slow? Evidence from profiler traces.",
    pretty_exceptions_enable=False,
)

EXIT_USAGE = 2


@app.command()
def analyze(
    inputs: opt.Inputs = None,
    model: opt.Model = None,
    tp: opt.Tp = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output folder for report.html, findings.json, trace.duckdb.")
    ] = Path("tracediag-out"),
    keep_python: opt.KeepPython = False,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="Parallel parser processes (default: one per rank file, up to the cores)."),
    ] = None,
    metrics: opt.Metrics = None,
    log: opt.Log = None,
    bench: opt.Bench = None,
    nccl_tests: opt.NcclTests = None,
    topology: opt.Topology = None,
    hbm_bandwidth: Annotated[
        float | None, typer.Option("--hbm-bandwidth", min=0.001, help="GPU memory bandwidth, GB/s.")
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option("--peak-tflops", min=0.001, help="GPU dense peak, TFLOP/s.")
    ] = None,
    slo: Annotated[
        str | None, typer.Option("--slo", help="Latency budgets in ms, e.g. ttft=500,tpot=50,e2el=10000.")
    ] = None,
    tp1_baseline: Annotated[Path | None, typer.Option("--tp1-baseline", help="A TP=1 trace of the same model.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")] = False,
    debug: opt.Debug = False,
) -> None:
    """Ingest traces and telemetry into DuckDB, run the rules, write report.html, findings.json, trace.duckdb."""
    from tracediag.analysis import analyze as run_analysis
    from tracediag.engine import Settings
    from tracediag.output import staged_outputs
    from tracediag.reports.terminal import print_summary

    extra = extra_inputs_from(metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests, topology=topology)

    def produce(staging: Path):
        settings = Settings(
            hbm_bandwidth_gbs=hbm_bandwidth,
            peak_tflops=peak_tflops,
            slo_ms=parse_slo(slo),
            tp1_baseline=str(tp1_baseline) if tp1_baseline else None,
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
        )

    report = _guard(lambda: staged_outputs(out, produce), debug)
    if not quiet:
        print_summary(report, out)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"tracediag {__version__}")


SLO_KEYS = ("ttft", "tpot", "itl", "e2el")
# CLI flag -> input format, for telemetry and micro-benchmark files given with an explicit kind.
FLAG_FORMATS = {
    "metrics": "prometheus",
    "log": "vllm-log",
    "bench": "vllm-bench",
    "nccl_tests": "nccl-tests",
    "topology": "topology",
}


def extra_inputs_from(**flags: list[Path] | None) -> list[tuple[Path, str]]:
    """(path, format) pairs from the --metrics/--log/--bench/--nccl-tests/--topology options."""
    return [(p, FLAG_FORMATS[flag]) for flag, paths in flags.items() for p in paths or []]


def parse_slo(text: str | None) -> tuple[tuple[str, float], ...]:
    """'ttft=500,tpot=50' -> (("ttft", 500.0), ("tpot", 50.0)); milliseconds."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        try:
            ms = float(value.strip().removesuffix("ms"))
        except ValueError:
            ms = -1.0
        if not sep or key not in SLO_KEYS or ms <= 0:
            raise UsageError(f"--slo: '{part}' is not KEY=MS with KEY one of {', '.join(SLO_KEYS)} and MS > 0")
        out.append((key, ms))
    return tuple(out)


def _guard(fn, debug: bool):
    try:
        return fn()
    except TracediagError as exc:
        if debug:
            raise
        typer.echo(f"tracediag: error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except Exception as exc:  # a bug in tracediag, not in the input: say so in one line
        if debug:
            raise
        typer.echo(
            f"tracediag: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the "
            "traceback and report it)",
            err=True,
        )
        raise typer.Exit(3) from None
    except KeyboardInterrupt:
        typer.echo("tracediag: interrupted; no output written", err=True)
        raise typer.Exit(130) from None


def _register_commands() -> None:
    import importlib

    from tracediag.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_commands()


def main() -> None:
    try:
        app()
    except MemoryError:
        print("tracediag: error: out of memory while analysing; pass fewer rank files at once", file=sys.stderr)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
