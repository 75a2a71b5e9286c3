"""Typer parameter declarations shared by the commands: one place for each flag's name, metavar and help.
Used as `opt.Model` etc.

Not in cli/__init__.py itself: that module registers the sub-commands when it is imported, so a command
module that imported from it would be imported half-way when it is loaded first."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracediag.cli.progress import HEARTBEAT_S
from tracediag.errors import UsageError
from tracediag.inputspec import BY_NAME


def _declared(name: str, type_: type, *short: str):
    """The option of input `name` as tracediag.inputspec declares it: flag, metavar, help and bounds."""
    spec = BY_NAME[name]
    bounds = {"min": spec.bounds[0], "max": spec.bounds[1]} if spec.bounds else {}
    help_ = spec.help[0].upper() + spec.help[1:] + "." + (f" Config: {spec.config_key}." if spec.config_key else "")
    return Annotated[type_ | None, typer.Option(spec.flag, *short, metavar=spec.metavar, help=help_, **bounds)]


Inputs = Annotated[
    list[Path] | None,
    typer.Argument(
        metavar="TRACES",
        help="Profiler traces (Kineto .json/.json.gz, nsys .sqlite) or folders of them, one file per rank.",
        show_default=False,
    ),
]
Model = Annotated[
    Path | None, typer.Option("--model", "-m", metavar="FILE", help="Hugging Face config.json of the served model.")
]
Tp = Annotated[
    int | None,
    typer.Option(
        "--tp", min=1, max=4096, metavar="N", help="Tensor-parallel degree (1 to 4096); overrides what the trace says."
    ),
]
Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        max=1024,
        metavar="N",
        help="Parallel parser processes (default: one per rank file, up to the cores).",
    ),
]
MemoryLimit = Annotated[
    str | None,
    typer.Option(
        "--memory-limit",
        metavar="SIZE",
        help="Memory budget of each parser process and of DuckDB, e.g. 512MiB, 2GiB (default 512MiB); "
        "traces are decoded in chunks within it, DuckDB spills to disk beyond it.",
    ),
]
Metrics = _declared("metrics", list[Path])
Log = _declared("log", list[Path])
Bench = _declared("bench", list[Path])
NcclTests = _declared("nccl_tests", list[Path])
Topology = _declared("topology", list[Path])
Slo = _declared("slo", str)
HbmBandwidth = _declared("hbm_bandwidth", float)
PeakTflops = _declared("peak_tflops", float)
Tp1Baseline = _declared("tp1_baseline", Path)
GraphCapture = _declared("graph_capture", Path)
Config = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="tracediag.toml or pyproject.toml ([tool.tracediag]); default: found from the current folder up.",
    ),
]
KeepPython = Annotated[bool, typer.Option("--keep-python", help="Also store python_function events.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No terminal summary.")]
Store = Annotated[
    Path | None,
    typer.Option(
        "--store",
        metavar="DIR",
        help="Read a Parquet store made by `tracediag ingest` instead of parsing traces (no inputs then).",
    ),
]
Ranks = Annotated[
    str | None,
    typer.Option(
        "--ranks",
        metavar="RANKS",
        help="Ranks that get the deep per-kernel analysis: 'all' or a list like 0,3,8-15 (default: every rank "
        "when there are at most 8, else one per TP group plus the stragglers COL005 names).",
    ),
]
Scheduler = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        help="With --store: run the per-TP-group rule evaluation on this dask.distributed scheduler "
        "(tcp://HOST:8786) instead of local processes.",
    ),
]
Progress = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Show progress on stderr, or not (default: unless --quiet): a spinner on a terminal, elsewhere a line "
        f"every {HEARTBEAT_S:g} s with the stage and the elapsed time.",
        show_default=False,
    ),
]


def _format(document: str):
    return Annotated[
        str,
        typer.Option(
            "--format",
            metavar="FORMAT",
            help=f"text (default): the summary; json: {document} on stdout, nothing else there (progress, warnings "
            "and errors stay on stderr).",
            show_default=False,
        ),
    ]


FindingsFormat = _format("the findings.json document")
CheckFormat = _format("the check.json document (the judged result)")
DiffFormat = _format("the diff.json document")
OUTPUT_FORMATS = ("text", "json")
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace existing files at the output paths that tracediag did not write (an input is never replaced).",
    ),
]


def output_path(text: str | None, option: str) -> Path | None:
    """An output path option as typed: an empty one (`-o ""`, an unset shell variable) is an error, not the current
    folder."""
    if text is None:
        return None
    if not text.strip():
        raise UsageError(f"{option}: empty path; give a file or folder name")
    return Path(text)


def output_format(text: str) -> str:
    """--format as given: text or json."""
    if text not in OUTPUT_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, got {text!r}")
    return text
