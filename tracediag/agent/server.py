"""The `tracediag mcp` server: tracediag's analysis as Model Context Protocol tools over stdio, on the official
SDK's `MCPServer` (mcp >= 2: the class v1 called FastMCP).

Each tool's arguments are its JSON schema (from the signature) and its result is structured content (from the
TypedDict it returns; the same JSON also comes as text for clients without structured output). An error the
CLI would print as one line (`tracediag: error: …`) comes back as a tool error with that line; a bug is a tool
error too (`tracediag: internal error: …`, traceback on stderr) — the server never stops for either. A long
analysis reports each stage as a progress notification when the client asks for progress. The store's column
docs (every column's unit and meaning, from the schema files) are resources: `tracediag://tables` and
`tracediag://tables/{table}`.

Each call is scoped (Workspace.scoped): its own allowed roots — the client's `roots` when it offers them (asked
through the SDK's ListRoots resolver: an input request on 2026-07-28 connections, a `roots/list` request on older
ones), else `--allow-root`, else the folder the server was started in; the runs folder always — and its own
cancellation flag. The work runs in a worker thread; when the client cancels the call (`notifications/cancelled`)
or goes away, the SDK cancels the handler, which sets the flag, so that a query is interrupted and an analysis stops
at its next stage, its staged files removed, before the handler returns. So the server exits as soon as its stdin
closes instead of finishing the work no one will read.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.resources import FunctionResource
from mcp.types import CallToolResult, ListRootsResult, TextContent, ToolAnnotations
from pydantic import ValidationError
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions before Python 3.12

from tracediag import __version__
from tracediag.agent.cancel import Cancel
from tracediag.agent.roots import Access, file_roots
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
    aspects: list[dict[str, Any]]  # each of the 7 aspects: same / differs / not comparable / not checked, with why
    checked: int  # aspects both runs knew
    summary: str  # "comparable on N of 7 aspects; not checked: ..."
    efficiency_comparable: bool  # per-op % of roofline: another GPU does not invalidate it
    efficiency_verdict: str


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
    efficiency: dict[str, Any]  # per-op % of each GPU's own roofline, before and after
    predictions: list[dict[str, Any]]  # the earlier run's priced changes against the measured ones
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
CANCEL_GRACE_S = 3.0  # how long a cancelled call waits for its work to stop (staged files removed) before it returns


def _argument_error(exc: ValidationError) -> str:
    """The CLI's one-line error for arguments that do not match the tool's input schema: the first argument named
    (`inputs[0]`, `tp`) with what was wrong — never the value, which is the caller's data and may be huge."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "tracediag: error: the arguments do not match the tool's input schema"
    first = errors[0]
    name = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(first["loc"]))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return " ".join(f"tracediag: error: {name or 'arguments'}: {first['msg']}{more}".split())


class _Server(MCPServer):
    """MCPServer whose argument-validation errors are one tracediag line naming the argument (the SDK's are
    pydantic's multi-line report, with the rejected value); that knows which calls' work is still running."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.working: set[threading.Event] = set()  # the `done` of each call whose worker thread has not ended

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call's work is running (at most `timeout_s`); False when some still is."""
        deadline = time.monotonic() + timeout_s
        return all(done.wait(max(0.0, deadline - time.monotonic())) for done in list(self.working))

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError) or not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(_argument_error(exc.__cause__)) from exc.__cause__


def _ask_client_roots(ctx: Context) -> ListRoots | None:
    """Ask for the client's roots when it declared the capability; None (use the server's own roots) otherwise."""
    caps = ctx.client_capabilities
    return ListRoots() if caps is not None and caps.roots is not None else None


# a parameter the SDK fills before the tool runs (not part of the tool's input schema)
ClientRoots = Annotated[ListRootsResult | None, Resolve(_ask_client_roots)]


async def _in_worker(work: Callable[[], Any], cancel: Cancel, working: set[threading.Event]) -> Any:
    """`work()` in a worker thread; when this call is cancelled (the client cancelled it or went away), set `cancel`
    so the work stops, and wait for it (at most CANCEL_GRACE_S) so that it has cleaned up when the call ends.
    `working` holds the call's `done` while its thread runs."""
    done = threading.Event()
    working.add(done)

    def run() -> Any:
        try:
            return work()
        finally:
            done.set()
            working.discard(done)

    try:
        # abandon_on_cancel: the thread cannot be cancelled, but this task must see the cancellation at once
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        cancel.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE_S):
            while not done.is_set():
                await anyio.sleep(0.02)
        raise


def build_server(runs_dir: Path, allow_roots: Sequence[Path] = ()) -> MCPServer:
    """The server with its tools and resources; `analyze` without `out` writes runs under `runs_dir`. Every path
    argument must lie inside the call's allowed roots (tracediag.agent.roots): the client's roots when it offers
    them, else `allow_roots` (--allow-root), else the folder the server was started in; the runs folder always."""
    base = Path.cwd()
    allow = list(allow_roots)
    shared = Workspace(runs_dir)  # the runs and analysed stores of all calls; each call gets its own scoped view

    def access(roots: ListRootsResult | None) -> Access:
        client = file_roots(str(r.uri) for r in roots.roots) if roots is not None else []
        return Access.of(client, allow, runs_dir, base)

    async def call(
        work: Callable[[Workspace, Callable[[str], None]], dict[str, Any]],
        ctx: Context | None,
        roots: ListRootsResult | None,
    ) -> Any:
        cancel = Cancel()

        def job() -> Any:
            try:
                ws = shared.scoped(access(roots), cancel)
            except TracediagError as exc:  # a client root that cannot be read, etc.: the CLI's one-line error
                from tracediag.errors import one_line

                return _error(f"tracediag: error: {one_line(exc)}")
            return _call(lambda say: work(ws, say), ctx)

        return await _in_worker(job, cancel, server.working)

    server = _Server("tracediag", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(annotations=WRITES)
    async def analyze(
        inputs: list[str],
        model: str | None = None,
        out: str | None = None,
        log: str | None = None,
        metrics: str | None = None,
        bench: str | None = None,
        tp: int | None = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> RunSummary:
        """Analyse profiler traces (Kineto .json/.json.gz, nsys .sqlite, or folders of them, one file per rank)
        and serving telemetry (log: a vLLM/SGLang engine log; metrics: /metrics scrapes; bench: a `vllm bench
        serve` result), with the served model's Hugging Face config.json as `model` and the tensor-parallel
        degree `tp` when the trace does not say. Writes report.html, findings.json and trace.duckdb into `out`
        (default: a new folder of the server's runs folder) and returns the run folder, the verdict, the
        coverage and the findings ranked by impact. Reports each stage as progress."""
        return await call(lambda ws, say: ws.analyze(inputs, model, out, log, metrics, bench, tp, progress=say), ctx,
                          roots)  # fmt: skip

    @server.tool(annotations=READ_ONLY)
    async def findings(run: str, ctx: Context | None = None, roots: ClientRoots = None) -> RunSummary:
        """The verdict, coverage and ranked findings of an existing run: an analyze or `check --out` folder, its
        findings.json or trace.duckdb, or a Parquet store made by `tracediag ingest` (analysed once)."""
        return await call(lambda ws, say: ws.findings(run, progress=say), ctx, roots)

    @server.tool(annotations=READ_ONLY)
    async def explain(run: str, rule: str, ctx: Context | None = None, roots: ClientRoots = None) -> Explanation:
        """One rule's outcome on a run (rule id such as COL002, or a finding id): status, formula, the formula
        with the values plugged in, the values by name, the evidence events (rank, step, ts_ns, name), the next
        check, why it could not run when it did not, and the rule's own documentation."""
        return await call(lambda ws, say: ws.explain(run, rule), None, roots)

    @server.tool(annotations=READ_ONLY)
    async def query(
        run: str,
        sql: str,
        max_rows: int | None = None,
        time_limit_s: float | None = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> QueryResult:
        """One read-only SQL SELECT over the run's trace.duckdb (DuckDB SQL; the tables and their columns with
        units: the tracediag://tables resources). Writes and other statements are refused; at most `max_rows`
        rows come back (default 200, at most 10,000) and at most 1 MiB of them (`truncated` and `truncated_by` say
        which cap cut the answer); the query runs under a memory limit and is stopped after `time_limit_s` seconds
        (default 10) or when the call is cancelled."""
        return await call(lambda ws, say: ws.query(run, sql, max_rows, time_limit_s), None, roots)

    @server.tool(annotations=READ_ONLY)
    async def diff(
        before: str,
        after: str,
        model: str | None = None,
        force_compare: bool = False,
        out: str | None = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> DiffResult:
        """What changed between two runs (output folders, findings.json files, traces or stores): first whether
        they are comparable — their fingerprints (model, layout, GPU, engine, step shapes, serving load, trace
        fitness) and each difference; then, when they are (or with force_compare), step time, shares,
        kernel-family time, collectives, payloads, dispatch and findings added/fixed. `out`: also write
        diff.json and diff.html there."""
        return await call(lambda ws, say: ws.diff(before, after, model, force_compare, out), None, roots)

    @server.tool(annotations=WRITES)
    async def check(
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
        roots: ClientRoots = None,
    ) -> CheckOutcome:
        """The rules as a CI gate, as `tracediag check` gives it: outcome passed (exit 0), failed (1: a new
        finding at or above fail_on — info, warning or error — against `baseline` when given) or inconclusive
        (4: a rule in `require` could not run, or the run cannot be diagnosed); the judged items that are not
        plain passes, the verdict, the coverage and the command's own text. `rules` / `require`: ids or globs
        such as 'COL*,SHP001'."""
        return await call(
            lambda ws, say: ws.check(inputs, model, tp, fail_on, baseline, rules, require, config, out, log, metrics,
                                     bench, progress=say),
            ctx,
            roots,
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


def serve(runs_dir: Path, allow_roots: Sequence[Path] = ()) -> bool:
    """Serve over stdio until the client closes it. True when every call's work has ended; False when some is still
    running a second after (the cancelled handlers already waited CANCEL_GRACE_S: a stage that does not look at its
    cancellation flag): the caller then ends the process rather than wait for work no one will read (the worker
    threads would keep it alive)."""
    server = build_server(runs_dir, allow_roots)
    server.run("stdio")
    return server.wait_idle(1.0)
