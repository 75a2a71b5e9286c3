"""Library entry point: `analyze(paths, model=...) -> Report`. The CLI is a thin layer over this."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag.analyses.stragglers import rank_groups
from tracediag.context import Settings
from tracediag.derive.graph_capture import drop_gemm_overlay, overlay_gemm_shapes
from tracediag.derive.layout import Layout, TPDegree, detect_layout
from tracediag.derive.op_roofline import apply_measured_roofs
from tracediag.engine import load_rules, run_rules
from tracediag.errors import InputError, UsageError
from tracediag.findings import WALK_STEPS, Check, ranked_findings
from tracediag.findings import verdict as build_verdict
from tracediag.ingest import without_pandas
from tracediag.interrupt import interrupting
from tracediag.model import ModelConfig
from tracediag.pipeline import build_store, input_files
from tracediag.reports.sections import Section, build_sections
from tracediag.request import Request
from tracediag.rules import RULE_MODULES
from tracediag.store import comment_columns, query_dicts
from tracediag.version import __version__

SCHEMA_ID = "tracediag/findings-v1"


@dataclass
class Report:
    """Everything the renderers need; `to_dict()` is the findings.json document."""

    inputs: list[dict[str, Any]]
    model: ModelConfig | None
    tp: TPDegree | None
    checks: list[Check]
    sections: list[Section] = field(default_factory=list)
    layout: Layout | None = None
    ranks: dict[str, Any] | None = None  # which ranks were analysed, not deep-analysed, missing (fleet.ranks)
    fitness: dict[str, Any] | None = None  # the profiled window's class and numbers (tracediag/derive/fitness.py)
    db_path: Path | None = field(default=None, repr=False, compare=False)  # the trace.duckdb analyze wrote, if any

    @property
    def findings(self) -> list[Check]:
        """Ranked by impact, each cause followed by the findings that may be its consequences."""
        return ranked_findings(self.checks)

    @property
    def verdict(self) -> dict[str, Any]:
        """What most likely limits the run, its cost, the next check, and how many rules could run."""
        return build_verdict(self.checks, fitness=self.fitness)

    def __repr__(self) -> str:
        """One line: the inputs, the verdict and the counts (the dataclass repr was the whole report, 90 kB)."""
        v = self.verdict
        n = sum(c.status == "finding" for c in self.checks)
        names = ", ".join(Path(str(i.get("path", "?"))).name for i in self.inputs[:3])
        more = f" +{len(self.inputs) - 3}" if len(self.inputs) > 3 else ""
        return (
            f"<Report of {len(self.inputs)} input{'s' if len(self.inputs) != 1 else ''} ({names}{more}): "
            f"{v.get('status')}: {v.get('headline')!r}; {n} finding{'s' if n != 1 else ''} of {len(self.checks)} "
            "checks>"
        )

    def save(self, folder: str | Path, store: str | Path | None = None) -> Path:
        """Write the files `tracediag analyze --out` writes into `folder`: findings.json and report.html, and
        trace.duckdb when the analysis had one (its `db_path`, or `store`: a trace.duckdb to copy in). Written the
        way the CLI writes them: staged beside the folder and moved in whole, never a partial file; returns
        the folder."""
        import shutil

        from tracediag.output import staged_outputs

        source = Path(store) if store is not None else self.db_path
        if source is not None and not source.is_file():
            raise InputError(source, "no trace.duckdb there to save with the report")

        def produce(staging: Path) -> Report:
            if source is not None:
                shutil.copyfile(source, staging / "trace.duckdb")
            return self

        staged_outputs(Path(folder), produce)
        return Path(folder)

    def _repr_html_(self) -> str:  # Jupyter
        from tracediag.reports.html import render_fragment

        return render_fragment(self)

    @property
    def cost_model(self) -> dict[str, Any]:
        verdicts = {c.rule: c.cost_model_applies for c in self.checks if c.cost_model_applies is not None}
        against = [c for c in self.checks if c.cost_model_applies is False]
        return {
            "applies": (not against) if verdicts else None,
            "formula": "t_comm = 2L·τ_AR(T·H·e_a, p), τ_AR ≈ α_p + 2(p−1)S/(p·B_p)",
            "verdicts": verdicts,
            "reasons": [f"{c.rule}: {c.title}" for c in against],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "tool": {"name": "tracediag", "version": __version__},
            "inputs": self.inputs,
            "model": self.model.to_dict() if self.model else None,
            "tp": {"p": self.tp.p, "source": self.tp.source} if self.tp else None,
            "layout": self.layout.to_dict() if self.layout else None,
            "ranks": self.ranks,
            "fitness": self.fitness,
            "cost_model": self.cost_model,
            "verdict": self.verdict,
            "walk": {str(k): v for k, v in WALK_STEPS.items()},
            "checks": [c.to_dict() for c in self.checks],
            "findings": [c.to_dict() for c in self.findings],
            "sections": {s.id: s.to_dict() for s in self.sections},
        }


def _input_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One entry per input file, with its ranks and what was ingested/derived from it."""
    rows = query_dicts(
        con,
        """
        SELECT i.input_id, any_value(i.path) AS path, any_value(i.format) AS format,
            any_value(i.profiler) AS profiler, list(i.rank ORDER BY i.rank) FILTER (WHERE i.rank IS NOT NULL) AS ranks,
            any_value(i.rank_source) AS rank_source, max(i.world_size) AS world_size,
            any_value(i.backend) AS backend, any_value(i.device_name) AS device,
            sum(i.events_total) AS events_total, sum(i.events_python_skipped) AS python_events_skipped,
            min(i.trace_start_ns) AS trace_start_ns, max(i.trace_end_ns) AS trace_end_ns,
            coalesce(sum(i.bad_records), 0) AS bad_records
        FROM inputs i GROUP BY i.input_id ORDER BY i.input_id""",
    )
    counts = {  # rows per rank first: the join then has one row per rank, not per event
        table: dict(
            con.execute(
                f"SELECT i.input_id, sum(t.n)::BIGINT FROM (SELECT rank, count(*) AS n FROM {table} GROUP BY rank) t "
                "JOIN inputs i USING (rank) GROUP BY i.input_id"
            ).fetchall()
        )
        for table in ("kernels", "cpu_ops", "collectives", "steps")
    }
    unparsed = dict(
        con.execute(
            "SELECT i.input_id, sum(u.occurrences) FROM step_annotations_unparsed u JOIN inputs i USING (rank) "
            "GROUP BY i.input_id"
        ).fetchall()
    )
    out = []
    for r in rows:
        c = {t: counts[t].get(r["input_id"], 0) for t in counts}
        c["step_annotations_not_understood"] = int(unparsed.get(r["input_id"], 0))
        c |= {"events_total": r.pop("events_total"), "python_events_skipped": r.pop("python_events_skipped")}
        c["bad_records"] = int(r.pop("bad_records"))
        r.pop("input_id")
        r["ranks"] = r["ranks"] or []
        out.append(r | {"counts": c})
    return out


def _without_pandas(fn: Callable) -> Callable:
    """Run `fn` with no pandas import on the way (ingest.without_pandas: ~0.4 s of every run otherwise)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with without_pandas():
            return fn(*args, **kwargs)

    return run


@_without_pandas
def analyze(
    paths: list[str | Path],
    model: str | Path | ModelConfig | None = None,
    tp: int | None = None,
    db_path: str | Path | None = None,
    keep_python: bool = False,
    jobs: int | None = None,
    settings: Settings | None = None,
    extra_inputs: list[tuple[str | Path, str]] = (),
    extra_rules: list[str] = (),
    extra_sections: list[str] = (),
    store: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    ranks: str | list[int] | None = None,
    scheduler: Any = None,
    memory_limit: int | str | None = None,
    rules: tuple[str, ...] | None = None,
    *,
    column_comments: bool = True,
    config: str | Path | bool = False,
    **inputs: Any,
) -> Report:
    """Ingest inputs into a DuckDB store (file `db_path` or in memory), derive, run the rules.

    The inputs are the CLI's (tracediag.inputspec), with its checks (`tp` 1 to 4096, `jobs` 1 to 1024, bandwidth
    and peak > 0 and ≤ 1e5, `slo` as 'ttft=500,tpot=50', `memory_limit` in bytes or as '2GiB'), as keywords:
    `log`, `metrics`, `bench`, `nccl_tests`, `topology` (a path or a list), `slo`, `hbm_bandwidth` (GB/s),
    `peak_tflops`, `tp1_baseline`, `graph_capture`; each fills `extra_inputs` or `settings` as the option of the
    same name does (a value given both ways is an error). `config`: a tracediag.toml to take settings from (True:
    find one from the working folder up, as the commands do; default none).

    `paths` are traces or folders of traces (format detected from content); `extra_inputs` are
    (path, format) pairs given with an explicit format (CLI --metrics, --log, --bench, ...).
    `extra_rules` / `extra_sections` are module names run after the registered ones (development, plugins).
    `store` is a Parquet store made by `tracediag ingest` (tracediag.fleet): its tables are read through views,
    nothing is parsed or derived again, and `paths`/`extra_inputs` must be empty.
    `progress(stage)` is called as each stage starts (the CLI shows it on a terminal).
    `ranks` chooses the ranks that get the deep per-kernel analysis: None (default: every rank when there are at
    most 8, else one per TP group plus the stragglers COL005 names), "all", a list of ranks, or text like
    "0,3,8-15" (tracediag.fleet.ranks). With several TP groups the rules run per group and are merged; on a
    store the groups run as local processes, or on the Dask cluster `scheduler` (an address or a Client).
    `memory_limit` is the memory budget (tracediag.memory; None: DEFAULT_MEMORY_LIMIT): the parsers'
    chunks and spill threshold, DuckDB's memory_limit, and the TP=1 baseline's store.
    `rules` (rule ids): run only these registered rules (`tracediag check --rules`); None runs every rule.
    `column_comments`: give the file store's columns their unit and meaning (for whoever opens trace.duckdb; False
    for a store that only this process reads back, such as `tracediag check` without --out).
    """
    loaded = model if isinstance(model, ModelConfig) else None
    request = Request.build(
        list(paths) if isinstance(paths, (list, tuple)) else paths,
        model=None if loaded is not None else model,
        tp=tp,
        keep_python=keep_python,
        jobs=jobs,
        ranks=ranks,
        memory_limit=memory_limit,
        config=config,
        settings=settings,
        store=store,
        scheduler=scheduler,
        rules=rules,
        extra_rules=extra_rules,
        side_inputs=extra_inputs,
        **inputs,
    )
    if loaded is not None:
        request = request.with_model(loaded)
    return run(request, db_path, extra_sections=extra_sections, progress=progress, column_comments=column_comments)


def run(
    request: Request,
    db_path: str | Path | None = None,
    *,
    extra_sections: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    column_comments: bool = True,
) -> Report:
    """The analysis of a checked request (tracediag.request): its store built (or a Parquet store opened), the
    rules run, the report assembled. `analyze` is this with the inputs as keywords."""
    say = progress or (lambda stage: None)
    store = request.store
    if store is not None:
        if request.traces or request.side_inputs:
            raise UsageError("--store replaces the inputs: give either traces or --store, not both")
        from tracediag.fleet import open_store_views

        say(f"opening the store {store}")
        con = open_store_views(store, db_path)
    else:
        files = input_files(request.traces, request.side_inputs)
        con = build_store(files, db_path=db_path, options=request.ingest_options(), jobs=request.jobs, progress=say)
    try:
        with interrupting(con):  # a stopped call's running statement ends at once (tracediag.interrupt)
            report = evaluate(con, request, extra_sections, progress=say)
        if db_path is not None and store is None:
            if column_comments:
                comment_columns(con)  # unit and meaning of every column, for whoever opens the file
            report.db_path = Path(db_path)
        return report
    except duckdb.Error as exc:  # a store's file damaged after ingest: the input's fault, named, not a bug
        err = None
        if store is not None:
            from tracediag.store.parquet import read_error

            err = read_error(exc, (Path(store),))
        if err is None:
            raise
        raise err from None
    finally:
        con.close()


def evaluate(
    con: duckdb.DuckDBPyConnection,
    request: Request,
    extra_sections: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run the rules and build the report sections on a store that holds canonical and derived tables.

    One TP group with every rank deep-analysed (the usual incident): the rules run once on the whole store.
    Otherwise (tracediag.fleet): per TP group, on views restricted to its ranks and its deep ranks, merged.
    A TP=1 baseline (settings.tp1_baseline) is read once, within `memory_limit`, for every rule and group of
    this process."""
    from tracediag.fleet.groups import evaluate_groups
    from tracediag.fleet.ranks import LocalCopies, cross_group, make_plan, merge_group_checks, ranks_section, restricted

    say = progress or (lambda stage: None)
    settings, store = request.settings, request.store
    # a store's small tables read from memory while one group runs on the whole store (dropped before groups)
    copies = LocalCopies.of_store(con, store) if store is not None else LocalCopies(con)
    baseline = request.baseline()
    overlaid = False  # the capture's GEMM shapes over gemm_shapes (derive/graph_capture.py): one group, no --store
    try:
        layout = detect_layout(con, request.tp)
        tpd = layout.tp
        ranks = list(request.ranks) if isinstance(request.ranks, tuple) else request.ranks
        plan = make_plan(con, layout, ranks, failed=_failed_inputs(con, store))
        ctx = request.context(con, layout, baseline)
        if len(plan.groups) <= 1 and plan.all_deep:
            if settings.graph_capture and store is None:
                overlaid = overlay_gemm_shapes(con, settings.graph_capture) is not None
            if store is None:  # measured roofs by flag replace the catalogue's in op_roofline (a --store is read-only)
                apply_measured_roofs(con, settings.peak_tflops, settings.hbm_bandwidth_gbs)
            mods = load_rules(request.rules) + [importlib.import_module(m) for m in request.extra_rules
                                                if m not in RULE_MODULES]  # fmt: skip
            with ctx.memoized():  # the store does not change between the rules and the sections: shared answers
                say(f"running {len(mods)} rules")
                checks = run_rules(ctx, mods)
                plan.why = plan.why or {r: "every rank" for r in plan.present}
                say("building the report")
                sections = build_sections(ctx, extra=extra_sections)
                fitness = with_host_rules(ctx.fitness(), checks)  # the rules' summary, not a second one
        else:
            copies.drop()
            say(f"running the rules on {len(plan.groups)} TP group(s)")
            results = evaluate_groups(con, plan, request, baseline)
            checks = merge_group_checks([(r.group, r.checks) for r in results])
            plan.deep = sorted({d for r in results for d in r.deep})
            plan.why = {d: why for r in results for d, why in r.deep.items()}
            plan.group_summaries = [r.summary for r in results]
            plan.cross_group = cross_group(plan.group_summaries)
            say("building the report")
            # the report's skew table and chart match unrecorded process groups within each TP group, as the
            # per-group rules did
            by_group = {r: g.name for g in plan.groups for r in g.ranks}
            with restricted(con, plan.present, plan.deep), rank_groups(con, by_group):
                sections = build_sections(ctx, extra=extra_sections)
            fitness = with_host_rules(ctx.fitness(), checks)
        if plan.present:
            sections.append(ranks_section(plan))
        inputs = _input_rows(con)
    finally:
        if overlaid:
            drop_gemm_overlay(con)
        copies.drop()
        if baseline is not None:
            baseline.close()
    return Report(
        inputs=inputs,
        model=request.model,
        tp=tpd,
        checks=checks,
        sections=sections,
        layout=layout,
        ranks=plan.to_dict(),
        fitness=fitness,
    )


# not-applicable reasons that name an input only the host side holds: recorded op shapes, CPU ops, launch calls
_HOST_INPUT = re.compile(r"GEMM input shapes|CPU ops?\b|missing runtime")


def with_host_rules(fitness: dict[str, Any] | None, checks: list[Check]) -> dict[str, Any] | None:
    """The fitness with, for a GPU-only trace (fitness `host_side`, derive/fitness.py), the rules the missing host
    side left without an input (`rules_disabled`) named in its why."""
    host = (fitness or {}).get("host_side")
    if not host:
        return fitness
    off = sorted(c.rule for c in checks if c.status == "not_applicable" and _HOST_INPUT.search(c.reason or ""))
    why = host["why"] + (f"; rules without an input for it: {', '.join(off)}" if off else "")
    return fitness | {"host_side": host | {"rules_disabled": off, "why": why}}


def _failed_inputs(con: duckdb.DuckDBPyConnection, store: str | Path | None) -> list[dict[str, Any]]:
    """Inputs a store's ingest could not read (its manifest's `failed`), as {path, error}."""
    if store is None:
        return []
    from tracediag.store.parquet import read_manifest

    return list(read_manifest(Path(store)).doc.get("failed", []))
