"""`tracediag scrape`: the CLI over tracediag.live.scrape (timestamped /metrics scrapes for --metrics)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tracediag.errors import UsageError

if TYPE_CHECKING:
    from tracediag.live.scrape import ScrapeResult


def register(app: typer.Typer) -> None:
    @app.command()
    def scrape(
        url: Annotated[
            str, typer.Argument(metavar="URL", help="vLLM /metrics URL, e.g. http://127.0.0.1:8000/metrics.")
        ],
        interval: Annotated[
            str, typer.Option("--interval", metavar="TIME", help="Time between scrapes: 500ms, 1s, 5s…")
        ] = "1s",
        duration: Annotated[
            str, typer.Option("--duration", metavar="TIME", help="How long to scrape: 30s, 5m, 1h…")
        ] = "5m",
        out_text: Annotated[
            str,
            typer.Option(
                "--out", "-o", metavar="FILE", help="Output file (replaced when tracediag wrote it; else --force)."
            ),
        ] = "metrics.prom",
        force: Annotated[
            bool, typer.Option("--force", help="Replace an existing output file that tracediag did not write.")
        ] = False,
        timeout: Annotated[str, typer.Option("--timeout", metavar="TIME", help="HTTP timeout per scrape.")] = "5s",
        max_failures: Annotated[
            int,
            typer.Option(
                "--max-failures", min=1, metavar="N", help="Stop after this many failed scrapes in a row (≥ 1)."
            ),
        ] = 5,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress.")] = False,
    ) -> None:
        """Poll a vLLM /metrics endpoint into a file of timestamped scrapes (read it with analyze --metrics).

        \b
        Example:
          tracediag scrape http://127.0.0.1:8000/metrics --interval 1s --duration 5m -o metrics.prom
        """
        from tracediag.files import OutputGuard
        from tracediag.live.scrape import metrics_url, parse_duration, scrape_to_file  # http, ssl: not for analyze

        try:
            out = Path(out_text)
            if not out_text.strip():
                raise UsageError("--out: empty path; give a file name")
            OutputGuard(force=force).check_file(out, "--out")
            target = metrics_url(url)
            interval_s = parse_duration(interval, "--interval")
            duration_s = parse_duration(duration, "--duration")
            timeout_s = parse_duration(timeout, "--timeout")
            if out.parent and not out.parent.exists():
                raise UsageError(f"--out: folder {out.parent} does not exist")
        except UsageError as exc:
            typer.echo(f"tracediag: error: {exc}", err=True)
            raise typer.Exit(2) from None
        tty = sys.stderr.isatty()

        def progress(res: ScrapeResult, planned: int, status: str) -> None:
            if quiet:
                return
            line = (
                f"scrape {res.scrapes + res.failures}/{planned}: {status} — {res.scrapes} written "
                f"({res.samples:,} samples, {res.bytes / 1024:,.1f} KiB), {res.failures} failed"
            )
            typer.echo(("\r" + line[:150].ljust(150)) if tty else line, err=True, nl=not tty)

        if not quiet:
            typer.echo(
                f"scraping {target} every {interval_s:g} s for {duration_s:g} s into {out} (Ctrl-C to stop)", err=True
            )
        res = scrape_to_file(target, out, interval_s, duration_s, timeout_s, max_failures, progress)
        if tty and not quiet:
            typer.echo("", err=True)
        summary = f"{res.scrapes} scrapes ({res.samples:,} samples) written to {out}; stopped: {res.stopped}"
        if res.scrapes == 0:
            typer.echo(
                f"tracediag: error: no scrape succeeded from {target}: {res.last_error or res.stopped}", err=True
            )
            raise typer.Exit(2)
        typer.echo(summary, err=True)
