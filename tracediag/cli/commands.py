"""The sub-commands, one module each with `register(app: typer.Typer)`; the CLI adds them in this order."""

COMMAND_MODULES: tuple[str, ...] = (
    "tracediag.cli.analyze",
    "tracediag.cli.ingest",
    "tracediag.cli.check",
    "tracediag.cli.diff",
    "tracediag.cli.env",
    "tracediag.cli.scrape",
    "tracediag.cli.capture",
    "tracediag.cli.mcp",
)
