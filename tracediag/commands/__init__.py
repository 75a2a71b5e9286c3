"""Sub-commands beyond `analyze`, one module each with `register(app: typer.Typer)`; the CLI adds them in order."""

COMMAND_MODULES: tuple[str, ...] = (
    "tracediag.commands.check",
    "tracediag.commands.diff",
    "tracediag.commands.env",
    "tracediag.commands.scrape",
)
