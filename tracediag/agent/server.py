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
from pydantic import ConfigDict, Field, ValidationError, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions before Python 3.12

from tracediag import __version__
from tracediag.agent.cancel import Cancel
from tracediag.agent.readonly_sql import MAX_ROWS, MAX_TIME_LIMIT_S, ROW_CAP, TIME_LIMIT_S
from tracediag.agent.roots import Access, file_roots
from tracediag.agent.tools import KEEP_RUNS, TP_MAX, Workspace, jsonable
from tracediag.errors import TracediagError
from tracediag.inputspec import INPUTS, RATE_BOUNDS

INSTRUCTIONS = """\
tracediag tells why an LLM inference service is slow, from profiler traces (PyTorch/Kineto JSON, Nsight Systems
exports), vLLM/SGLang logs, /metrics scrapes and benchmark results. Start with `analyze` (traces and/or
log/metrics/bench files, plus the model's config.json as `model`): it writes a run folder and returns the verdict,
the coverage (which rules could not run and the input that would enable them) and the findings ranked by impact;
`kept` false says the run folder is temporary (gone when the server stops: pass `out` to keep it).
Then `explain` a finding's rule (formula, numbers, evidence events, next check), `query` the run's trace.duckdb
with one read-only SELECT (column docs: the tracediag://tables resources), `diff` two runs (it first says
whether they are comparable) and `check` a run as a CI gate (passed / failed / inconclusive)."""


# --- arguments: each one's meaning, unit and range, in the input schema the server publishes ----------------

_IN_ROOTS = (
    "; it must lie inside the call's allowed roots (the client's roots, else the server's --allow-root folders, "
    "else the folder it was started in; the runs folder always), after links and '..' are resolved"
)
_RUN = (
    "a run: the folder analyze or `check --out` wrote, its findings.json or trace.duckdb, or a Parquet store "
    "written by `tracediag ingest` (analysed once into the runs folder)" + _IN_ROOTS
)


def _arg(description: str, **schema: Any) -> Any:
    """A parameter's description, and the JSON-schema bounds published with it. Bounds are published, not enforced
    by the schema validation, so that a value out of range gets the CLI's own one-line error naming the argument."""
    return Field(description=description, json_schema_extra=schema or None)


Inputs = Annotated[
    list[str],
    _arg(
        "paths of profiler traces (PyTorch/Kineto .json or .json.gz, Nsight Systems .sqlite) or folders of them, one "
        "file per rank; may be empty when log, metrics or bench is given" + _IN_ROOTS,
    ),
]
Model = Annotated[
    str | None,
    _arg("path of the served model's Hugging Face config.json; without it the rules that need the model's shapes "
         "(heads, hidden size, layers) cannot run" + _IN_ROOTS),
]  # fmt: skip
Out = Annotated[
    str | None,
    _arg("folder to write this call's files into (analyze: findings.json, report.html, trace.duckdb; check: those "
         "and check.json; diff: diff.json, diff.html), created when missing, the files of an earlier tracediag run "
         "there replaced, never one of the inputs nor a file tracediag did not write; default: analyze writes a new "
         "run-N folder of the server's runs folder, check and diff write nothing" + _IN_ROOTS),
]  # fmt: skip
Paths = str | list[str] | None  # one path, or several of the same kind
Log = Annotated[Paths, _arg("path(s) of vLLM or SGLang engine logs (text)" + _IN_ROOTS)]
Metrics = Annotated[
    Paths, _arg("path(s) of Prometheus /metrics scrapes (text exposition format, as `tracediag scrape` writes)"
                + _IN_ROOTS)
]  # fmt: skip
Bench = Annotated[
    Paths, _arg("path(s) of benchmark results: `vllm bench serve` JSON, SGLang bench_serving JSONL or an aiperf "
                "profile export" + _IN_ROOTS)
]  # fmt: skip
NcclTests = Annotated[Paths, _arg("path(s) of nccl-tests output (all_reduce_perf …): the measured bus bandwidth "
                                  "PATH002 and COL003 compare with" + _IN_ROOTS)]  # fmt: skip
Topology = Annotated[Paths, _arg("path(s) of `tracediag env` snapshots (GPUs, NVLink/PCIe links, NICs): PATH001's "
                                 "link class" + _IN_ROOTS)]  # fmt: skip
Slo = Annotated[
    str | None,
    _arg("latency budgets in milliseconds, e.g. 'ttft=500,tpot=50,e2el=10000' (keys ttft, tpot, itl, e2el); "
         "default: the config's slo, else none (SCH010 cannot run)"),
]  # fmt: skip
HbmBandwidth = Annotated[
    float | None,
    _arg("the GPU's memory bandwidth in GB/s (> 0, ≤ 100,000); default: the catalogue's figure for the GPU the "
         "trace names", exclusiveMinimum=0, maximum=RATE_BOUNDS[1]),
]  # fmt: skip
PeakTflops = Annotated[
    float | None,
    _arg("the GPU's dense peak for the activation dtype in TFLOP/s (> 0, ≤ 100,000); default: the catalogue's",
         exclusiveMinimum=0, maximum=RATE_BOUNDS[1]),
]  # fmt: skip
Tp1Baseline = Annotated[
    str | None, _arg("path of a TP=1 trace of the same model: COL003's projection slope, KRN007's GEMM rates"
                     + _IN_ROOTS)
]  # fmt: skip
GraphCapture = Annotated[
    str | None,
    _arg("path of the trace of the CUDA/HIP graph capture beside its replay: replayed kernels get their capturing "
         "ops (shapes for the per-op roofline)" + _IN_ROOTS),
]  # fmt: skip
Ranks = Annotated[
    str | list[int] | None,
    _arg("ranks that get the deep per-kernel analysis: 'all', a list of ranks, or text like '0,3,8-15'; default: "
         "every rank when there are at most 8, else one per TP group plus the stragglers"),
]  # fmt: skip
KeepPython = Annotated[bool | None, _arg("also store python_function events (default false)")]
MemoryLimit = Annotated[
    str | int | None,
    _arg("memory budget of the parsers and DuckDB: bytes, or a size such as '512MiB', '2GiB' (at least 64 MiB); "
         "default 512MiB"),
]  # fmt: skip
TP = Annotated[
    int | None,
    _arg(f"tensor-parallel degree (GPUs per model replica), 1 to {TP_MAX:,}; default: read from the trace "
         "(distributedInfo, collectives)", minimum=1, maximum=TP_MAX),
]  # fmt: skip
Rule = Annotated[
    str, _arg("a rule id such as COL002 (any case) or a finding id from analyze's findings", maxLength=200)
]
SQL = Annotated[
    str,
    _arg("one read-only DuckDB SELECT (or WITH … SELECT) over the run's trace.duckdb; the tables and their columns, "
         "with units: the tracediag://tables resources"),
]  # fmt: skip
MaxRows = Annotated[
    int | None, _arg(f"rows to return at most, 1 to {ROW_CAP:,}; default {MAX_ROWS}", minimum=1, maximum=ROW_CAP)
]
TimeLimit = Annotated[
    float | None,
    _arg(f"seconds the query may run, above 0 and at most {MAX_TIME_LIMIT_S:g}; default {TIME_LIMIT_S:g}",
         exclusiveMinimum=0, maximum=MAX_TIME_LIMIT_S),
]  # fmt: skip
Before = Annotated[str, _arg("the earlier run, or a trace, folder of traces or store to analyse as one: " + _RUN)]
After = Annotated[str, _arg("the later run, given as `before` is: " + _RUN)]
ForceCompare = Annotated[
    bool, _arg("compare the measures even when the runs are not comparable (another model, layout or GPU); "
               "default false: only the comparability verdict")
]  # fmt: skip
FailOn = Annotated[
    Literal["info", "warning", "error"] | None,
    _arg("the lowest severity of a new finding that fails the gate; default: warning (or the config's fail_on)"),
]
Baseline = Annotated[
    str | None,
    _arg("an earlier run to judge against: only findings new or worse than in it fail the gate; " + _RUN),
]
Rules = Annotated[
    str | None,
    _arg("the rules to run: comma-separated ids or globs such as 'COL*,SHP001'; default: every rule"),
]
Require = Annotated[
    str | None,
    _arg("rules that must run (ids or globs, comma-separated): the outcome is inconclusive when one could not"),
]
Config = Annotated[
    str | None,
    _arg("path of a tracediag.toml or a pyproject.toml with [tool.tracediag] (the gate's settings and "
         "expectations); default: the one found from the server's folder up, if any" + _IN_ROOTS),
]  # fmt: skip
AnalyzeConfig = Annotated[
    str | None,
    _arg("path of a tracediag.toml or a pyproject.toml with [tool.tracediag]: its settings (slo, hbm_bandwidth_gbs, "
         "peak_tflops, tp1_baseline, graph_capture, tolerances) apply where no argument gives the same; default: "
         "the one found from the server's folder up, if any" + _IN_ROOTS),
]  # fmt: skip


def _given(arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool's arguments that are run inputs (tracediag.inputspec) besides the traces and the model, by name."""
    return {k: v for k, v in arguments.items() if k in RUN_INPUTS}


RUN_INPUTS = frozenset(s.name for s in INPUTS) - {"traces", "model", "jobs"}
RunArg = Annotated[str, _arg(_RUN[0].upper() + _RUN[1:])]


# --- structured results ------------------------------------------------------------------------------------
# Each tool's result type is its output schema. A row type is open (`extra="allow"`): a field a later version adds
# comes through (and the schema says additionalProperties) instead of being dropped by the result's validation.
# A number that can be non-finite (a change from 0, a rate of inf) is `float | str`: tools.jsonable writes such a
# float as its text ("inf"), since JSON has no infinity.

OPEN = ConfigDict(extra="allow")
Ratio = float | str | None  # a share, a change or a rate: a float, or its text when it is not finite


class Verdict(TypedDict):
    status: Annotated[
        str | None,
        Field(description="problem / no_problem / nothing_ran / inconclusive (and any status a later version adds)"),
    ]
    headline: str | None
    rule: Annotated[str | None, Field(description="the rule whose finding is the headline")]
    severity: Annotated[str | None, Field(description="info / warning / error")]
    confidence: Annotated[str | None, Field(description="high / medium / low")]
    cost: Annotated[str | None, Field(description='what the finding costs, in words ("50% of the steady GPU time")')]
    next_check: str | None
    explains: Annotated[list[str] | None, Field(description="the findings this one explains (downstream of it)")]


@with_config(OPEN)
class Enable(TypedDict):
    input: Annotated[
        str,
        Field(
            description='the input to pass: a CLI flag such as "--log" (the MCP argument of that name, where the '
            "tool has one)"
        ),
    ]
    rules: Annotated[list[str], Field(description="the rules it would enable")]


@with_config(OPEN)
class Coverage(TypedDict):
    rules: Annotated[int | None, Field(description="rules known")]
    ran: int | None
    could_not_run: int | None
    text: str | None
    enable: list[Enable]


@with_config(OPEN)
class Finding(TypedDict):
    id: Annotated[
        str,
        Field(
            description="the finding id (the rule id, with a suffix when a rule has several findings): explain's `rule`"
        ),
    ]
    rule: str
    severity: str | None
    title: str
    impact: Annotated[
        Ratio, Field(description="the finding's share of the time it is measured against (0.5: half), the ranking key")
    ]
    cost: str
    confidence: str | None
    downstream_of: Annotated[list[str], Field(description="the findings this one is a consequence of")]


class RunSummary(TypedDict):
    run: Annotated[str, Field(description="the run folder: give it as `run` to findings, explain, query, diff")]
    kept: Annotated[
        bool,
        Field(description="False: the folder is in the server's temporary runs folder, removed when the server stops"),
    ]
    kept_note: Annotated[str, Field(description="where the run is, and for how long")]
    verdict: Verdict
    coverage: Coverage
    findings: list[Finding]
    tp: int | None
    model: str | None
    truncated: Annotated[
        list[str],
        Field(description='the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")'),
    ]


@with_config(OPEN)
class Evidence(TypedDict, total=False):
    rank: int | None
    step: int | None
    ts_ns: Annotated[int | None, Field(description="the event's start on the trace's clock, ns")]
    name: Annotated[str | None, Field(description="the event's name (an op, a kernel, a runtime call)")]


class Explanation(TypedDict):
    run: str
    id: str
    rule: str
    status: Annotated[str, Field(description="finding / pass / skipped (could not run)")]
    title: str
    step: Annotated[int | None, Field(description="the diagnostic walk's step (1: shapes … 5: roofline)")]
    walk_step: str | None
    rule_title: str | None
    severity: str | None
    confidence: str | None
    impact: Ratio
    cost: str | None
    formula: str | None
    substituted: Annotated[str | None, Field(description="the formula with the measured values plugged in")]
    values: Annotated[
        dict[str, Any],
        Field(description="every value of the formula and its inputs, by name (the rule's own; units in the names)"),
    ]
    evidence: list[Evidence]
    next_check: str | None
    reason: Annotated[str | None, Field(description="why it could not run, and what would let it")]
    downstream_of: list[str]
    table: Annotated[
        list[dict[str, Any]],
        Field(description="the rule's per-rank / per-step table (its columns are the rule's), first rows"),
    ]
    table_rows: Annotated[int, Field(description="rows the table has in all")]
    also: Annotated[list[str], Field(description="other findings of the same rule")]
    about: Annotated[str | None, Field(description="the rule's documentation")]
    truncated: Annotated[
        list[str],
        Field(description='the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")'),
    ]


class QueryResult(TypedDict):
    run: str
    columns: list[str]
    types: Annotated[list[str], Field(description="DuckDB type of each column (BIGINT, DOUBLE, VARCHAR, …)")]
    rows: Annotated[list[list[Any]], Field(description="one list per row, one cell per column")]
    row_count: int
    truncated: bool
    truncated_by: Annotated[str | None, Field(description='"max_rows" or "max_bytes": which cap stopped the answer')]
    max_rows: int
    max_bytes: int


@with_config(OPEN)
class Aspect(TypedDict):
    aspect: Annotated[str, Field(description="model / layout / gpu / engine / step_shapes / workload / fitness")]
    label: str
    status: Annotated[str, Field(description="same / differs / not comparable / not checked")]
    why: str | None


@with_config(OPEN)
class Difference(TypedDict):
    aspect: str
    what: str
    before: Any
    after: Any
    invalidates: Annotated[bool, Field(description="True: this difference alone makes the runs not comparable")]


class Comparability(TypedDict):
    comparable: bool
    verdict: str
    forced: bool
    differences: list[Difference]
    not_checked: list[str]
    aspects: Annotated[
        list[Aspect],
        Field(description="each of the 7 aspects: same / differs / not comparable / not checked, with why"),
    ]
    checked: Annotated[int, Field(description="aspects both runs knew")]
    summary: Annotated[str, Field(description='"comparable on N of 7 aspects; not checked: ..."')]
    efficiency_comparable: Annotated[
        bool, Field(description="per-op % of roofline: another GPU does not invalidate it")
    ]
    efficiency_verdict: str


@with_config(OPEN)
class FindingChange(TypedDict, total=False):
    rule: str
    id: str
    severity: str | None
    title: str
    impact: Ratio


class FindingChanges(TypedDict, total=False):
    added: list[FindingChange]
    removed: list[FindingChange]
    fixed: list[FindingChange]
    no_longer_evaluated: list[FindingChange]
    changed: list[FindingChange]
    unchanged: list[FindingChange]


@with_config(OPEN)
class StepTime(TypedDict, total=False):
    phase: Annotated[str, Field(description="prefill / decode / mixed")]
    T_bucket: Annotated[str, Field(description='the step\'s token count bucket ("T=33-64")')]
    before_median_ns: float | None
    after_median_ns: float | None
    change: Annotated[Ratio, Field(description="after / before − 1")]
    before_steps: Annotated[int | None, Field(description="steps of the bucket before (None: no steps on that side)")]
    after_steps: Annotated[int | None, Field(description="steps of the bucket after (None: no steps on that side)")]


@with_config(OPEN)
class Prediction(TypedDict, total=False):
    rule: str
    phase: str | None
    status: Annotated[
        str,
        Field(
            description="within / outside / confounded / …: the measured change against the earlier run's prediction"
        ),
    ]
    text: str
    formula: str
    predicted: dict[str, Any]
    measured: dict[str, Any]


@with_config(OPEN)
class DiffResult(TypedDict):
    schema: str
    before: Annotated[
        dict[str, Any], Field(description="the earlier run: path, kind, tp, model, inputs, device, findings")
    ]
    after: dict[str, Any]
    comparability: Comparability
    fingerprints: Annotated[
        dict[str, Any], Field(description="before / after: model, layout, gpu, engine, step_shapes, workload, fitness")
    ]
    headlines: list[str]
    notes: list[str]
    findings: FindingChanges
    step_time: list[StepTime]
    communication_share: Annotated[list[dict[str, Any]], Field(description="phase, before, after, change")]
    attention_share: Annotated[list[dict[str, Any]], Field(description="phase, before, after, change")]
    kernel_family_time: Annotated[
        list[dict[str, Any]], Field(description="klass, family, before/after total, per step, calls, mean")
    ]
    collectives_per_step: Annotated[list[dict[str, Any]], Field(description="phase, op, before, after, change, ranges")]
    payload_per_call: Annotated[
        list[dict[str, Any]], Field(description="key (op), calls, mean bytes, dtypes before and after")
    ]
    payload_by_dtype: list[dict[str, Any]]
    dispatch_changes: list[dict[str, Any]]
    efficiency: Annotated[dict[str, Any], Field(description="per-op % of each GPU's own roofline, before and after")]
    predictions: Annotated[
        list[Prediction], Field(description="the earlier run's priced changes against the measured ones")
    ]
    out: str | None
    truncated: Annotated[
        list[str],
        Field(description='the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")'),
    ]


@with_config(OPEN)
class GateCoverage(TypedDict, total=False):
    rules: int
    ran: int
    passed: int
    findings: int
    could_not_run: int
    enable: list[Enable]
    not_applicable_to_inputs: Any


@with_config(OPEN)
class JudgedItem(TypedDict, total=False):
    suite: Annotated[str, Field(description="rules / expect / baseline")]
    id: str
    rule: str | None
    step: int | None
    name: str
    status: Annotated[str, Field(description="fail / finding / skipped (plain passes are left out)")]
    severity: str | None
    required: bool
    message: str


class CheckOutcome(TypedDict):
    outcome: Literal["passed", "failed", "inconclusive"]
    exit_code: Annotated[int, Field(description="the command's exit status: 0 passed, 1 failed, 4 inconclusive")]
    fail_on: str
    inconclusive: list[str]
    counts: Annotated[dict[str, int], Field(description="judged items by status: pass, fail, finding, skipped")]
    coverage: GateCoverage
    verdict: Verdict
    outcomes: list[JudgedItem]
    warnings: list[str]
    text: str
    out: str | None
    truncated: Annotated[
        list[str],
        Field(description='the lists and strings cut to keep the answer within its byte cap ("findings: 12 of 3,000")'),
    ]


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


# True hints. A tool that can write files (analyze, check, and diff with `out`) is not read-only, and it is
# destructive: given an `out` that holds an earlier run, it replaces that run's files (never a file tracediag did not
# write: the output guard refuses those). Not idempotent: without `out`, analyze writes a new run-N each call. None
# reaches beyond the machine. `findings` of a Parquet store writes only into the server's own runs folder (the store
# analysed once), nothing of the caller's.
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
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
        names = sorted(t.name for t in await self.list_tools())
        if name not in names:  # the SDK's own answer is "Unknown tool: …", not the CLI's line
            shown = name[:100] if isinstance(name, str) else type(name).__name__
            raise ToolError(f"tracediag: error: no tool '{shown}' (tools: {', '.join(names)})")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError):  # a crash outside the tool's work (its answer's schema, …)
                from tracediag.errors import one_line

                cause = exc.__cause__ or exc
                traceback.print_exception(cause, file=sys.stderr)
                line = one_line(f"tracediag: internal error: {type(cause).__name__}: {cause}")
                raise ToolError(line + " (please report it)") from cause
            if not isinstance(exc.__cause__, ValidationError):
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


# how a tool runs its work: `call(work, ctx, roots)`, work(workspace scoped to the call, progress) -> the answer
Call = Callable[..., Any]


def build_server(
    runs_dir: Path, allow_roots: Sequence[Path] = (), temporary: bool = False, keep_runs: int = KEEP_RUNS
) -> MCPServer:
    """The server with its tools and resources; `analyze` without `out` writes runs under `runs_dir` (`temporary`:
    a folder removed when the server stops, which each run summary says). Every path
    argument must lie inside the call's allowed roots (tracediag.agent.roots): the client's roots when it offers
    them, else `allow_roots` (--allow-root), else the folder the server was started in; the runs folder always."""
    base = Path.cwd()
    allow = list(allow_roots)
    # the runs and analysed stores of all calls; each call gets its own scoped view
    shared = Workspace(runs_dir, temporary=temporary, keep_runs=keep_runs)

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

    _add_analyze(server, call)
    _add_reading_tools(server, call)
    _add_check(server, call)
    _add_table_resources(server)
    return server


def _add_analyze(server: MCPServer, call: Call) -> None:
    """The `analyze` tool: a run written from the inputs `tracediag analyze` takes."""

    @server.tool(annotations=WRITES)
    async def analyze(
        inputs: Inputs,
        model: Model = None,
        out: Out = None,
        log: Log = None,
        metrics: Metrics = None,
        bench: Bench = None,
        tp: TP = None,
        nccl_tests: NcclTests = None,
        topology: Topology = None,
        slo: Slo = None,
        hbm_bandwidth: HbmBandwidth = None,
        peak_tflops: PeakTflops = None,
        tp1_baseline: Tp1Baseline = None,
        graph_capture: GraphCapture = None,
        ranks: Ranks = None,
        keep_python: KeepPython = None,
        memory_limit: MemoryLimit = None,
        config: AnalyzeConfig = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> RunSummary:
        """Analyse profiler traces (Kineto .json/.json.gz, nsys .sqlite, or folders of them, one file per rank)
        and serving telemetry (log: vLLM/SGLang engine logs; metrics: /metrics scrapes; bench: `vllm bench
        serve` results), with the served model's Hugging Face config.json as `model` and the tensor-parallel
        degree `tp` when the trace does not say; the other inputs are those of `tracediag analyze`, each enabling
        the rules the coverage names. Writes report.html, findings.json and trace.duckdb into `out` (default: a
        new folder of the server's runs folder) and returns the run folder, the verdict, the coverage and the
        findings ranked by impact. Reports each stage as progress."""
        given = _given(locals())
        return await call(lambda ws, say: ws.analyze(inputs, model, out, progress=say, config=config, **given), ctx,
                          roots)  # fmt: skip


def _add_reading_tools(server: MCPServer, call: Call) -> None:
    """The tools that read runs (findings, explain, query) and compare them (diff)."""

    @server.tool(annotations=READ_ONLY)
    async def findings(run: RunArg, ctx: Context | None = None, roots: ClientRoots = None) -> RunSummary:
        """The verdict, coverage and ranked findings of an existing run: an analyze or `check --out` folder, its
        findings.json or trace.duckdb, or a Parquet store made by `tracediag ingest` (analysed once)."""
        return await call(lambda ws, say: ws.findings(run, progress=say), ctx, roots)

    @server.tool(annotations=READ_ONLY)
    async def explain(run: RunArg, rule: Rule, ctx: Context | None = None, roots: ClientRoots = None) -> Explanation:
        """One rule's outcome on a run (rule id such as COL002, or a finding id): status, formula, the formula
        with the values plugged in, the values by name, the evidence events (rank, step, ts_ns, name), the next
        check, why it could not run when it did not, and the rule's own documentation."""
        return await call(lambda ws, say: ws.explain(run, rule), None, roots)

    @server.tool(annotations=READ_ONLY)
    async def query(
        run: RunArg,
        sql: SQL,
        max_rows: MaxRows = None,
        time_limit_s: TimeLimit = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> QueryResult:
        """One read-only SQL SELECT over the run's trace.duckdb (DuckDB SQL; the tables and their columns with
        units: the tracediag://tables resources). Writes and other statements are refused; at most `max_rows`
        rows come back (default 200, at most 10,000) and at most 1 MiB of them (`truncated` and `truncated_by` say
        which cap cut the answer); the query runs under a memory limit and is stopped after `time_limit_s` seconds
        (default 10) or when the call is cancelled."""
        return await call(lambda ws, say: ws.query(run, sql, max_rows, time_limit_s), None, roots)

    @server.tool(annotations=WRITES)
    async def diff(
        before: Before,
        after: After,
        model: Model = None,
        force_compare: ForceCompare = False,
        out: Out = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> DiffResult:
        """What changed between two runs (output folders, findings.json files, traces or stores): first whether
        they are comparable — their fingerprints (model, layout, GPU, engine, step shapes, serving load, trace
        fitness) and each difference; then, when they are (or with force_compare), step time, shares,
        kernel-family time, collectives, payloads, dispatch and findings added/fixed. `out`: also write
        diff.json and diff.html there."""
        return await call(lambda ws, say: ws.diff(before, after, model, force_compare, out), None, roots)


def _add_check(server: MCPServer, call: Call) -> None:
    """The `check` tool: the gate, on the inputs `analyze` takes."""

    @server.tool(annotations=WRITES)
    async def check(
        inputs: Inputs,
        model: Model = None,
        tp: TP = None,
        fail_on: FailOn = None,
        baseline: Baseline = None,
        rules: Rules = None,
        require: Require = None,
        config: Config = None,
        out: Out = None,
        log: Log = None,
        metrics: Metrics = None,
        bench: Bench = None,
        nccl_tests: NcclTests = None,
        topology: Topology = None,
        slo: Slo = None,
        hbm_bandwidth: HbmBandwidth = None,
        peak_tflops: PeakTflops = None,
        tp1_baseline: Tp1Baseline = None,
        graph_capture: GraphCapture = None,
        ranks: Ranks = None,
        keep_python: KeepPython = None,
        memory_limit: MemoryLimit = None,
        ctx: Context | None = None,
        roots: ClientRoots = None,
    ) -> CheckOutcome:
        """The rules as a CI gate, as `tracediag check` gives it: outcome passed (exit 0), failed (1: a new
        finding at or above fail_on — info, warning or error — against `baseline` when given) or inconclusive
        (4: a rule in `require` could not run, or the run cannot be diagnosed); the judged items that are not
        plain passes, the verdict, the coverage and the command's own text. `rules` / `require`: ids or globs
        such as 'COL*,SHP001'. The inputs are analyze's."""
        given = _given(locals())
        return await call(
            lambda ws, say: ws.check(inputs, model, fail_on, baseline, rules, require, config, out, progress=say,
                                     **given),
            ctx,
            roots,
        )  # fmt: skip


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


def serve(
    runs_dir: Path, allow_roots: Sequence[Path] = (), temporary: bool = False, keep_runs: int = KEEP_RUNS
) -> bool:
    """Serve over stdio until the client closes it. True when every call's work has ended; False when some is still
    running a second after (the cancelled handlers already waited CANCEL_GRACE_S: a stage that does not look at its
    cancellation flag): the caller then ends the process rather than wait for work no one will read (the worker
    threads would keep it alive)."""
    server = build_server(runs_dir, allow_roots, temporary, keep_runs)
    server.run("stdio")
    return server.wait_idle(1.0)
