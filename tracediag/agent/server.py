"""The `tracediag mcp` server: tracediag's analysis as Model Context Protocol tools over stdio, on the official
SDK's `MCPServer` (mcp >= 2: the class v1 called FastMCP).

Each tool's arguments are its JSON schema (from the signature) and its result is structured content (from the
TypedDict it returns; the same JSON also comes as text for clients without structured output). An error the
CLI would print as one line (`tracediag: error: …`) comes back as a tool error with that line; a bug is a tool
error too (`tracediag: internal error: …`, traceback on stderr) — the server never stops for either. A long
analysis reports each stage as a progress notification when the client asks for progress. The store's column
docs (every column's unit and meaning, from the schema files) are resources: `tracediag://tables` and
`tracediag://tables/{table}`.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio.from_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resources import FunctionResource
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions before Python 3.12

from tracediag import __version__
from tracediag.agent.roots import Access
from tracediag.agent.tools import Workspace, jsonable
from tracediag.errors import TracediagError

INSTRUCTIONS = """\
tracediag tells why an LLM inference service is slow, from profiler traces (PyTorch/Kineto JSON, Nsight Systems
exports), vLLM/SGLang logs, /metrics scrapes and benchmark results. Start with `analyze` (traces and/or
log/metrics/bench files, plus the model's config.json as `model`): it writes a run folder and returns the verdict,
the coverage (which rules could not run and the input that would enable them) and the findings ranked by impact.
Then `explain` a finding's rule (formula, numbers, evidence events, next check), `query` the run's trace.duckdb
with one read-only SELECT (column docs: the tracediag://tables resources), `diff` two runs (it first says
whether they are comparable) and `check` a run as a CI gate (passed / failed / inconclusive)."""


# --- structured results ------------------------------------------------------------------------------------


class Verdict(TypedDict):
    status: str | None  # problem / no_problem / nothing_ran / inconclusive (and any status a later version adds)
    headline: str | None
    rule: str | None
    severity: str | None
    confidence: str | None
    cost: str | None
    next_check: str | None
    explains: list[str] | None


class Coverage(TypedDict):
    rules: int | None
    ran: int | None
    could_not_run: int | None
    text: str | None
    enable: list[dict[str, Any]]


class Finding(TypedDict):
    id: str
    rule: str
    severity: str | None
    title: str
    impact: float | None
    cost: str
    confidence: str | None
    downstream_of: list[str]


class RunSummary(TypedDict):
    run: str
    verdict: Verdict
    coverage: Coverage
    findings: list[Finding]
    tp: int | None
    model: str | None
    truncated: list[str]  # the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")


class Explanation(TypedDict):
    run: str
    id: str
    rule: str
    status: str
    title: str
    step: int | None
    walk_step: str | None
    rule_title: str | None
    severity: str | None
    confidence: str | None
    impact: float | None
    cost: str | None
    formula: str | None
    substituted: str | None
    values: dict[str, Any]
    evidence: list[dict[str, Any]]
    next_check: str | None
    reason: str | None
    downstream_of: list[str]
    table: list[dict[str, Any]]
    table_rows: int
    also: list[str]
    about: str | None
    truncated: list[str]  # the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")


class QueryResult(TypedDict):
    run: str
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    truncated_by: str | None  # "max_rows" or "max_bytes": which cap stopped the answer
    max_rows: int
    max_bytes: int


class Comparability(TypedDict):
    comparable: bool
    verdict: str
    forced: bool
    differences: list[dict[str, Any]]
    not_checked: list[str]


class DiffResult(TypedDict):
    schema: str
    before: dict[str, Any]
    after: dict[str, Any]
    comparability: Comparability
    fingerprints: dict[str, Any]
    headlines: list[str]
    notes: list[str]
    findings: dict[str, list[dict[str, Any]]]
    step_time: list[dict[str, Any]]
    communication_share: list[dict[str, Any]]
    attention_share: list[dict[str, Any]]
    kernel_family_time: list[dict[str, Any]]
    collectives_per_step: list[dict[str, Any]]
    payload_per_call: list[dict[str, Any]]
    payload_by_dtype: list[dict[str, Any]]
    dispatch_changes: list[dict[str, Any]]
    out: str | None
    truncated: list[str]  # the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")


class CheckOutcome(TypedDict):
    outcome: Literal["passed", "failed", "inconclusive"]
    exit_code: int
    fail_on: str
    inconclusive: list[str]
    counts: dict[str, int]
    coverage: dict[str, Any]
    verdict: Verdict
    outcomes: list[dict[str, Any]]
    warnings: list[str]
    text: str
    out: str | None
    truncated: list[str]  # the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")


# --- calling the library -----------------------------------------------------------------------------------


def _error(line: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=line)], is_error=True)


def _call(work: Callable[[Callable[[str], None]], dict[str, Any]], ctx: Context | None) -> Any:
    """Run `work(progress)` in this worker thread; its result as JSON, or the CLI's one-line error as a tool error.

    `progress(stage)` sends a progress notification per stage (a no-op when the client did not ask for progress).
    """
    from tracediag.errors import one_line

    stages = 0

    def progress(stage: str) -> None:
        nonlocal stages
        stages += 1
        if ctx is not None:
            anyio.from_thread.run(ctx.report_progress, stages, None, stage)

    try:
        return jsonable(work(progress))
    except TracediagError as exc:
        return _error(f"tracediag: error: {one_line(exc)}")
    except MemoryError:
        return _error("tracediag: error: out of memory while analysing; pass fewer rank files at once")
    except Exception as exc:  # a bug in tracediag, not in the input: said in one line, the server goes on
        traceback.print_exc(file=sys.stderr)
        return _error(one_line(f"tracediag: internal error: {type(exc).__name__}: {exc}") + " (please report it)")


READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def build_server(runs_dir: Path, allow_roots: Sequence[Path] = ()) -> MCPServer:
    """The server with its tools and resources; `analyze` without `out` writes runs under `runs_dir`. Every path
    argument must lie inside the allowed roots (tracediag.agent.roots): `allow_roots` (--allow-root), else the folder
    the server was started in; the runs folder always."""
    ws = Workspace(runs_dir).scoped(Access.of([], list(allow_roots), runs_dir), None)
    server = MCPServer("tracediag", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(annotations=WRITES)
    def analyze(
        inputs: list[str],
        model: str | None = None,
        out: str | None = None,
        log: str | None = None,
        metrics: str | None = None,
        bench: str | None = None,
        tp: int | None = None,
        ctx: Context | None = None,
    ) -> RunSummary:
        """Analyse profiler traces (Kineto .json/.json.gz, nsys .sqlite, or folders of them, one file per rank)
        and serving telemetry (log: a vLLM/SGLang engine log; metrics: /metrics scrapes; bench: a `vllm bench
        serve` result), with the served model's Hugging Face config.json as `model` and the tensor-parallel
        degree `tp` when the trace does not say. Writes report.html, findings.json and trace.duckdb into `out`
        (default: a new folder of the server's runs folder) and returns the run folder, the verdict, the
        coverage and the findings ranked by impact. Reports each stage as progress."""
        return _call(lambda say: ws.analyze(inputs, model, out, log, metrics, bench, tp, progress=say), ctx)

    @server.tool(annotations=READ_ONLY)
    def findings(run: str, ctx: Context | None = None) -> RunSummary:
        """The verdict, coverage and ranked findings of an existing run: an analyze or `check --out` folder, its
        findings.json or trace.duckdb, or a Parquet store made by `tracediag ingest` (analysed once)."""
        return _call(lambda say: ws.findings(run, progress=say), ctx)

    @server.tool(annotations=READ_ONLY)
    def explain(run: str, rule: str) -> Explanation:
        """One rule's outcome on a run (rule id such as COL002, or a finding id): status, formula, the formula
        with the values plugged in, the values by name, the evidence events (rank, step, ts_ns, name), the next
        check, why it could not run when it did not, and the rule's own documentation."""
        return _call(lambda say: ws.explain(run, rule), None)

    @server.tool(annotations=READ_ONLY)
    def query(run: str, sql: str, max_rows: int | None = None, time_limit_s: float | None = None) -> QueryResult:
        """One read-only SQL SELECT over the run's trace.duckdb (DuckDB SQL; the tables and their columns with
        units: the tracediag://tables resources). Writes and other statements are refused; at most `max_rows`
        rows come back (default 200, at most 10,000; `truncated` says when there were more), and the query is
        stopped after `time_limit_s` seconds (default 10)."""
        return _call(lambda say: ws.query(run, sql, max_rows, time_limit_s), None)

    @server.tool(annotations=READ_ONLY)
    def diff(
        before: str, after: str, model: str | None = None, force_compare: bool = False, out: str | None = None
    ) -> DiffResult:
        """What changed between two runs (output folders, findings.json files, traces or stores): first whether
        they are comparable — their fingerprints (model, layout, GPU, engine, step shapes, serving load, trace
        fitness) and each difference; then, when they are (or with force_compare), step time, shares,
        kernel-family time, collectives, payloads, dispatch and findings added/fixed. `out`: also write
        diff.json and diff.html there."""
        return _call(lambda say: ws.diff(before, after, model, force_compare, out), None)

    @server.tool(annotations=WRITES)
    def check(
        inputs: list[str],
        model: str | None = None,
        tp: int | None = None,
        fail_on: str | None = None,
        baseline: str | None = None,
        rules: str | None = None,
        require: str | None = None,
        config: str | None = None,
        out: str | None = None,
        log: str | None = None,
        metrics: str | None = None,
        bench: str | None = None,
        ctx: Context | None = None,
    ) -> CheckOutcome:
        """The rules as a CI gate, as `tracediag check` gives it: outcome passed (exit 0), failed (1: a new
        finding at or above fail_on — info, warning or error — against `baseline` when given) or inconclusive
        (4: a rule in `require` could not run, or the run cannot be diagnosed); the judged items that are not
        plain passes, the verdict, the coverage and the command's own text. `rules` / `require`: ids or globs
        such as 'COL*,SHP001'."""
        return _call(
            lambda say: ws.check(inputs, model, tp, fail_on, baseline, rules, require, config, out, log, metrics,
                                 bench, progress=say),
            ctx,
        )  # fmt: skip

    _add_table_resources(server)
    return server


def _table_markdown(table: str, columns: dict[str, str]) -> str:
    lines = [f"# {table}", "", "| column | unit and meaning |", "|---|---|"]
    lines += [f"| `{c}` | {text.replace('|', '/')} |" for c, text in columns.items()]
    return "\n".join(lines) + "\n"


def _add_table_resources(server: MCPServer) -> None:
    from tracediag.store import column_docs

    docs = column_docs()
    index = ["# trace.duckdb tables", "", "Each table's columns: tracediag://tables/TABLE.", ""]
    index += [f"- `{t}` ({len(cols)} columns)" for t, cols in sorted(docs.items())]
    index_text = "\n".join(index) + "\n"
    server.add_resource(
        FunctionResource.from_function(
            lambda: index_text,
            uri="tracediag://tables",
            name="tables",
            description="The tables of a run's trace.duckdb, with links to each table's column docs.",
            mime_type="text/markdown",
        )
    )
    for table, cols in sorted(docs.items()):
        text = _table_markdown(table, cols)
        server.add_resource(
            FunctionResource.from_function(
                lambda text=text: text,
                uri=f"tracediag://tables/{table}",
                name=f"table {table}",
                description=f"Columns of `{table}` in trace.duckdb: each column's unit and meaning.",
                mime_type="text/markdown",
            )
        )


def serve(runs_dir: Path, allow_roots: Sequence[Path] = ()) -> None:
    """Serve over stdio until the client closes it."""
    build_server(runs_dir, allow_roots).run("stdio")
