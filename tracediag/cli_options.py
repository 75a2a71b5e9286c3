"""Typer parameter declarations shared by `tracediag analyze` (cli.py) and `tracediag check`
(commands/check.py): one place for each flag's name, bounds and help. Used as `opt.Model` etc.

Not in cli.py itself: cli.py registers the sub-commands when it is imported, so a command module that
imported from it would be imported half-way when it is loaded first."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Inputs = Annotated[
    list[Path] | None,
    typer.Argument(help="Profiler traces (Kineto .json/.json.gz, nsys .sqlite) or folders of them, one per rank."),
]
Model = Annotated[Path | None, typer.Option("--model", "-m", help="Hugging Face config.json of the served model.")]
Tp = Annotated[int | None, typer.Option("--tp", min=1, help="Tensor-parallel degree; overrides what the trace says.")]
Metrics = Annotated[list[Path] | None, typer.Option("--metrics", help="vLLM /metrics scrapes (Prometheus text).")]
Log = Annotated[list[Path] | None, typer.Option("--log", help="vLLM engine/server logs.")]
Bench = Annotated[list[Path] | None, typer.Option("--bench", help="`vllm bench serve` result JSON.")]
NcclTests = Annotated[list[Path] | None, typer.Option("--nccl-tests", help="nccl-tests output.")]
Topology = Annotated[list[Path] | None, typer.Option("--topology", help="`tracediag env` snapshot JSON.")]
KeepPython = Annotated[bool, typer.Option("--keep-python", help="Also store python_function events.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
