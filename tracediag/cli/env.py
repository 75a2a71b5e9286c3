"""`tracediag env`: the CLI over tracediag.live.topology (NVML snapshot for --topology)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def env(
        out: Annotated[
            Path, typer.Option("--out", "-o", metavar="FILE", help="Where to write the snapshot JSON.")
        ] = Path("topo.json"),
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the summary.")] = False,
    ) -> None:
        """Snapshot the GPUs with NVML (name, memory, clocks, NVLink per link, P2P, PCIe, NUMA) for --topology.

        \b
        Example:
          tracediag env -o topo.json && tracediag analyze traces/ -m config.json --topology topo.json
        """
        from tracediag.live.topology import summary, take_snapshot  # imported by this command only

        snap = take_snapshot()
        try:
            out.write_text(json.dumps(snap, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            typer.echo(f"tracediag: error: {out}: cannot write ({exc.strerror or exc})", err=True)
            raise typer.Exit(2) from None
        if not quiet:
            for line in summary(snap):
                typer.echo(line)
            typer.echo(
                f"Wrote {out}"
                + ("" if snap["nvml"]["available"] else " (it records that no GPU data could be read)")
                + "; pass it to `tracediag analyze --topology`."
            )
