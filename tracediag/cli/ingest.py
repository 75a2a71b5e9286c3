"""`tracediag ingest`: parse traces once into a Parquet store that analyze/check/diff read with --store."""

from __future__ import annotations

from typing import Annotated

import typer

from tracediag.cli import options as opt


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)


def ingest(
    inputs: opt.Inputs = None,
    store: Annotated[
        str,
        typer.Option(
            "--store",
            metavar="DIR",
            help="Folder of the Parquet store (created or replaced; on a file system "
            "every worker can reach when --scheduler is given).",
        ),
    ] = "tracediag-store",
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            metavar="ADDRESS",
            help="A dask.distributed scheduler (tcp://HOST:8786): one ingest task per input file on its workers. "
            "Default: local processes.",
        ),
    ] = None,
    jobs: opt.Jobs = None,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going",
            help="Record an input that cannot be read (the manifest and the report list it) and go on with the rest.",
        ),
    ] = False,
    memory_limit: opt.MemoryLimit = None,
    metrics: opt.Metrics = None,
    log: opt.Log = None,
    bench: opt.Bench = None,
    nccl_tests: opt.NcclTests = None,
    topology: opt.Topology = None,
    keep_python: opt.KeepPython = False,
    quiet: opt.Quiet = False,
    debug: opt.Debug = False,
) -> None:
    """Parse traces and telemetry once into a Parquet store (tables partitioned by rank, plus a manifest).

    \b
    Examples:
      tracediag ingest traces/ --store incident-123.store
      tracediag analyze --store incident-123.store -m config.json -o report/
      tracediag ingest /shared/run42/rank*.json.gz --store /shared/run42.store --scheduler tcp://10.0.0.5:8786
    """
    from tracediag.cli import _guard, extra_inputs_from, memory_budget
    from tracediag.errors import UsageError
    from tracediag.files import OutputGuard, fault_reason, is_location_fault
    from tracediag.fleet import ingest_store

    extra = extra_inputs_from(metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests, topology=topology)

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(f"tracediag ingest: {msg}", err=True)

    def run():
        store_dir = opt.output_path(store, "--store")
        guard = OutputGuard.of(inputs, [p for p, _ in extra])
        if guard.is_input(store_dir):
            raise UsageError(f"--store {store_dir}: is one of the inputs; give another folder for the store")
        guard.check_link(store_dir, "--store")
        budget = memory_budget(memory_limit)
        try:
            return ingest_store(
                inputs or [],
                store_dir,
                extra_inputs=extra,
                keep_python=keep_python,
                jobs=jobs,
                scheduler=scheduler,
                progress=say,
                keep_going=keep_going,
                memory_limit=budget,
            )
        except Exception as exc:  # a read-only or full file system, a path that cannot be created: the user's to fix
            if is_location_fault(exc):
                raise UsageError(f"--store {store_dir}: cannot write the store there ({fault_reason(exc)})") from None
            raise

    result = _guard(run, debug)
    if not quiet:
        ranks = sorted({r for i in result.inputs for r in i["ranks"]})
        rows = sum(t["rows"] for t in result.tables.values())
        typer.echo(
            f"{len(result.inputs)} input(s), {len(ranks)} rank(s), {rows:,} rows in {len(result.tables)} tables "
            f"written to {result.store} in {result.elapsed_s:.1f} s ({result.backend}); "
            f"analyse it with: tracediag analyze --store {result.store}"
        )
        for f in result.failed:
            typer.echo(f"failed: {f['path']}: {f['error']}")
