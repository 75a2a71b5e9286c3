"""Command line: parses options, calls the library, picks a renderer. Errors users can fix are one line.

One module per command (`analyze.py`, `check.py`, `diff.py`, `env.py`, `scrape.py`), each with
`register(app)`, listed in `commands.py`; shared option declarations in `options.py`.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from tracediag.errors import TracediagError, UsageError, one_line
from tracediag.inputspec import INPUTS
from tracediag.version import __version__

EXIT_USAGE = 2
EXIT_INTERNAL = 3


class Terminated(SystemExit):
    """SIGTERM (`kill`, a container stopping, a CI job cancelled) as an exception: the `finally` blocks run, so the
    staging folder and the parser processes go with the run. Exit status 128 + 15, as the shell reports it."""


# Set when SIGTERM arrives. A signal that lands while DuckDB runs a query interrupts the query, and DuckDB
# replaces our exception with its own ("Query interrupted"): the flag tells that apart from a bug.
_TERMINATED = {"signum": 0}


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    _TERMINATED["signum"] = signum
    raise Terminated(128 + signum)


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Why is this LLM inference deployment slow? Evidence from profiler traces and serving telemetry.\n\n"
    "Start with: tracediag analyze TRACES... --model config.json",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: metavars (FILE, N, DIR) instead of type names, brackets kept as written
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _hide_type_placeholders() -> None:
    """Help shows an option's metavar (FILE, N) or nothing — never typer's `<list[Path]>`/`<bool>` labels or
    `[1<=x<=4096]`: bounds are stated in the help text.

    Why a patch of typer's classes: typer (0.29) has no public setting for these labels; the alternative, a
    click command class of our own per command, would replace far more of typer than these four attributes.
    tests/test_cli_polish.py fails when a typer release renames them (the labels would show again)."""
    from typer import core

    core.TyperOption.display_type = lambda self, ctx: self.metavar or ""  # type: ignore[method-assign]
    core.TyperArgument.display_type = lambda self, ctx: ""  # type: ignore[method-assign]  (the name is shown)
    core.TyperOption._get_number_range_help_str = lambda self: ""  # type: ignore[method-assign]
    # Usage line in the usual convention: required NAME, optional [NAME], repeatable NAME... (not `{NAME}`).
    core.TyperArgument._usage_display_name = lambda self: (  # type: ignore[method-assign]
        (self.display_name_raw if self.required else f"[{self.display_name_raw}]") + ("..." if self.nargs != 1 else "")
    )


_hide_type_placeholders()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tracediag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Why is this LLM inference deployment slow? Evidence from profiler traces and serving telemetry."""


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"tracediag {__version__}")


# input name -> its format, for telemetry and micro-benchmark files given with an explicit kind (tracediag.inputspec)
FLAG_FORMATS = {s.name: s.ingest_format for s in INPUTS if s.ingest_format is not None}


def extra_inputs_from(**flags: list[Path] | None) -> list[tuple[Path, str]]:
    """(path, format) pairs from the --metrics/--log/--bench/--nccl-tests/--topology options."""
    return [(p, FLAG_FORMATS[flag]) for flag, paths in flags.items() for p in paths or []]


def cli_request(given: dict, *, config=None, store=None, scheduler=None, rules=None):
    """The Request of a command's options (tracediag.request): `given` by input name (the positional traces as
    `inputs`), checked as every entry point checks them, errors naming the flags; tracediag.toml read from
    `config`, else found from the current folder up."""
    from tracediag.request import Request

    values = {k: v for k, v in given.items() if k != "inputs"}
    values = {k: (v or None) if isinstance(v, list) else v for k, v in values.items()}
    values["keep_python"] = values.get("keep_python") or None
    return Request.build(given.get("inputs") or [], naming="cli", config=config if config is not None else True,
                         store=store, scheduler=scheduler, rules=rules, **values)  # fmt: skip


def memory_budget(text: str | None) -> int | None:
    """--memory-limit as bytes for the library calls (None when not given: the default, tracediag.memory)."""
    from tracediag.memory import parse_size

    try:
        return parse_size(text) if text else None
    except ValueError as exc:
        raise UsageError(f"--memory-limit: {exc}") from None


def emit_json(document: bytes) -> None:
    """A --format json document on stdout. A reader that stops early (`| head`) ends the output quietly, as for any
    Unix filter, not with a traceback."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        # Python flushes stdout once more at exit; pointing it at /dev/null keeps that flush from failing as well
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None  # 128 + SIGPIPE, what the shell reports for a filter cut off


def _guard(fn, debug: bool):
    try:
        return fn()
    except TracediagError as exc:
        if debug:
            raise
        typer.echo(f"tracediag: error: {one_line(exc)}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except MemoryError:
        if debug:
            raise
        typer.echo("tracediag: error: out of memory while analysing; pass fewer rank files at once", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except Exception as exc:  # a bug in tracediag, not in the input: say so in one line
        if _TERMINATED["signum"]:  # DuckDB's "Query interrupted" after our SIGTERM: the signal, not a bug
            typer.echo("tracediag: terminated; no output written", err=True)
            raise Terminated(128 + _TERMINATED["signum"]) from None
        if _interrupted_query(exc):
            typer.echo("tracediag: interrupted; no output written", err=True)
            raise typer.Exit(130) from None
        if debug:
            raise
        typer.echo(
            one_line(f"tracediag: internal error: {type(exc).__name__}: {exc}")
            + " (rerun with --debug for the traceback and report it)",
            err=True,
        )
        raise typer.Exit(EXIT_INTERNAL) from None
    except KeyboardInterrupt:
        typer.echo("tracediag: interrupted; no output written", err=True)
        raise typer.Exit(130) from None
    except Terminated:
        typer.echo("tracediag: terminated; no output written", err=True)
        raise


def _interrupted_query(exc: BaseException) -> bool:
    """DuckDB turns a Ctrl-C that lands inside a query into its own exception."""
    return type(exc).__name__ == "InterruptException" or str(exc).startswith("Query interrupted")


def _register_commands() -> None:
    import importlib

    from tracediag.cli.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """The console script. Usage errors (a bad option value, a missing argument) are one line on stderr, as
    input errors are, not the parser's usage block: `tracediag: error: ... (see tracediag analyze --help)`."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="tracediag", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("tracediag: interrupted; no output written", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # the parser's errors: a bad value, an unknown option, a missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":  # `tracediag` alone: the help, as before
            exc.show()
            sys.exit(EXIT_USAGE)
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        print(f"tracediag: error: {one_line(exc.format_message())}{where}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except MemoryError:
        print("tracediag: error: out of memory while analysing; pass fewer rank files at once", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(code if isinstance(code, int) else 0)
