"""`tracediag mcp`: a Model Context Protocol server over stdio (tracediag.agent), for agents such as Claude
Desktop, Claude Code, VS Code or Cursor. Needs the `mcp` extra (the official MCP Python SDK)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

SDK_RANGE = "mcp>=2.3,<3"  # the `mcp` extra of pyproject.toml: the SDK's v2 API (mcp.server.mcpserver.MCPServer)
INSTALL = f"pip install '{SDK_RANGE}' (or pip install '.[mcp]' in tracediag's clone)"
MISSING_SDK = f"tracediag mcp needs the MCP Python SDK ({SDK_RANGE}): {INSTALL}"


def sdk_problem(version: str | None) -> str | None:
    """What is wrong with the installed MCP SDK `version` (None: not installed), or None when it is in SDK_RANGE."""
    if version is None:
        return MISSING_SDK
    parts = [int(p) if p.isdigit() else -1 for p in version.split(".")[:2]]
    major, minor = [*parts, 0, 0][:2]
    if major == 2 and minor >= 3:
        return None
    return (
        f"tracediag mcp needs the MCP Python SDK {SDK_RANGE}, and mcp {version} is installed (its "
        f"{'v1' if major < 2 else 'next major'} API is another): {INSTALL}"
    )


def _installed_sdk() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp")
    except PackageNotFoundError:
        return None


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)


def mcp(
    runs_dir: Annotated[
        Path | None,
        typer.Option(
            "--runs-dir",
            metavar="DIR",
            help="Where `analyze` writes runs given no `out` (run-1, run-2, ...); default: a temporary folder "
            "removed when the server stops.",
        ),
    ] = None,
    allow_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--allow-root",
            metavar="DIR",
            help="A folder the tools may read and write in (repeatable), when the client offers no roots of its "
            "own; default: the folder the server was started in. The runs folder is always allowed; every path is "
            "resolved (links, ..) before the check.",
        ),
    ] = None,
    keep_runs: Annotated[
        int,
        typer.Option(
            "--keep-runs",
            min=0,
            max=1_000_000,
            metavar="N",
            help="Runs kept in the runs folder: beyond N the oldest finished run-N folders are removed (0: keep all).",
        ),
    ] = 100,  # tracediag.agent.tools.KEEP_RUNS (not imported here: the CLI starts without the server's imports)
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Serve tracediag's tools over stdio for MCP clients: analyze, findings, explain, query, diff, check.

    The client starts this command and speaks JSON-RPC on its stdin and stdout; register it once, e.g.
    `claude mcp add tracediag -- tracediag mcp`. Tool errors carry the one-line message the CLI would print.
    The tools read and write only inside the client's roots (the folders open in the host) when it offers them,
    else the --allow-root folders, else the folder the server was started in. A call the client cancels stops
    its query or analysis; the server exits when the client closes its stdin.

    \b
    Examples:
      tracediag mcp
      tracediag mcp --runs-dir ~/tracediag-runs
      tracediag mcp --allow-root ~/traces --allow-root ~/incidents
    """
    from tracediag.cli import _guard
    from tracediag.errors import UsageError

    def run():
        problem = sdk_problem(_installed_sdk())
        if problem is not None:
            raise UsageError(problem)
        try:
            from tracediag.agent.server import serve
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in ("mcp", "mcp_types", "pydantic", "typing_extensions"):
                raise UsageError(MISSING_SDK) from None
            raise
        roots = list(allow_root or [])
        if runs_dir is not None:
            return serve(runs_dir, roots, keep_runs=keep_runs)
        with tempfile.TemporaryDirectory(prefix="tracediag-mcp-", ignore_cleanup_errors=True) as tmp:
            return serve(Path(tmp), roots, temporary=True, keep_runs=keep_runs)

    idle = _guard(run, debug)
    if idle is False:
        # the client is gone and a call's work is still in a stage that does not stop when cancelled: end the process
        # now (its worker threads would keep it alive as an orphan); its staged files go at the next run's start
        sys.stderr.flush()
        os._exit(0)
