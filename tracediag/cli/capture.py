"""`tracediag capture`: the CLI over tracediag.live.capture (profile + scrape + log of one window, then analyze)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli import options as opt


def register(app: typer.Typer) -> None:
    app.command("capture")(capture)


def capture(
    url: Annotated[str, typer.Argument(metavar="URL", help="The server, e.g. http://127.0.0.1:8000 (vLLM or SGLang).")],
    duration: Annotated[str, typer.Option("--duration", metavar="TIME", help="Length of the window: 10s, 1m…")] = "10s",
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=1, metavar="N", help="Engine steps to profile (passed to the engine's profiler)."),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            "--deadline", metavar="TIME", help="Whole-run limit, waiting for traces included (default: duration + 2m)."
        ),
    ] = None,
    interval: Annotated[str, typer.Option("--interval", metavar="TIME", help="Time between /metrics scrapes.")] = "1s",
    out_text: Annotated[
        str, typer.Option("--out", "-o", metavar="DIR", help="Incident folder to create (must be new or empty).")
    ] = "tracediag-capture",
    profile_dir: Annotated[
        Path | None,
        typer.Option(
            "--profile-dir", metavar="DIR", help="The server's profiler directory (vLLM), readable from here."
        ),
    ] = None,
    log_file: Annotated[
        Path | None,
        typer.Option("--log-file", metavar="FILE", help="The server's log file: its lines of the window are copied."),
    ] = None,
    timeout: Annotated[str, typer.Option("--timeout", metavar="TIME", help="HTTP timeout per request.")] = "5s",
    model: opt.Model = None,
    tp: opt.Tp = None,
    slo: Annotated[str | None, typer.Option("--slo", metavar="BUDGETS", help="Latency budgets in ms.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no terminal summary.")] = False,
    debug: opt.Debug = False,
) -> None:
    """Capture an incident in progress: the engine's torch profiler, /metrics and the server log of one window,
    then analyze them together into one folder (read it again with analyze/check/diff FOLDER).

    \b
    Example:
      tracediag capture http://127.0.0.1:8000 --duration 20s --profile-dir /tmp/vllm_profile --log-file server.log
    """
    from tracediag.analysis import analyze as run_analysis
    from tracediag.cli import _guard
    from tracediag.cli.progress import progress
    from tracediag.context import Settings, parse_slo
    from tracediag.ingest.capture_folder import capture_inputs
    from tracediag.live.capture import capture as run_capture
    from tracediag.live.scrape import parse_duration
    from tracediag.output import staged_outputs
    from tracediag.reports.terminal import print_summary

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(msg, err=True)

    out = Path(out_text)

    def run():
        nonlocal out
        out = opt.output_path(out_text, "--out")
        duration_s = parse_duration(duration, "--duration")
        res = run_capture(
            url,
            out,
            duration_s,
            interval_s=parse_duration(interval, "--interval"),
            steps=steps,
            deadline_s=parse_duration(deadline, "--deadline") if deadline else None,
            profile_dir=profile_dir,
            log_file=log_file,
            timeout_s=parse_duration(timeout, "--timeout"),
            progress=say,
        )
        say(
            f"captured {res.scrapes} scrapes, {len(res.traces)} trace file(s), "
            f"{res.log_lines if res.log_lines is not None else 'no'} log lines; profiler: {res.profiler}; "
            f"stopped: {res.stopped}"
        )
        inputs = capture_inputs(out)
        traces = [p for p, fmt in inputs if fmt is None]
        extra = [(p, fmt) for p, fmt in inputs if fmt is not None]

        def produce(staging: Path, stage):
            return run_analysis(
                traces,
                model=model,
                tp=tp,
                db_path=staging / "trace.duckdb",
                settings=Settings(slo_ms=parse_slo(slo)),
                extra_inputs=extra,
                progress=stage,
            )

        with progress(enabled=not quiet) as stage:  # the analysis only: the window prints its own lines
            return staged_outputs(out, lambda staging: produce(staging, stage))

    report = _guard(run, debug)
    if not quiet:
        print_summary(report, out)
    sys.stdout.flush()
