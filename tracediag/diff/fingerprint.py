"""A run's fingerprint: what it ran (model, parallel layout, GPU, engine), the shape of its steps and the load
it served — the facts two runs must share before a change between them can be called a regression.

Read from the run's store (trace.duckdb) when it has one, else from its findings.json: the model, TP and layout,
the GPU names and the fitness field are in findings.json itself; step shapes, bench parameters and startup facts
come from the store's tables or from the same rows in findings.json's report sections. A fact neither holds is
None: `comparability` then says it could not be checked, never that it matched.
"""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any

import orjson

from tracediag.measures import WHOLE_TRACE
from tracediag.runs import RunData
from tracediag.store.readback import open_read_back

# Model fields that make two configs the same model: shape, architecture, dtype, MoE/MLA/sliding-window layout
# and the quantization config verbatim. The file's path and how fields were resolved (notes) are not identity.
MODEL_IDENTITY = (
    "architecture", "model_type", "L", "H", "I", "h", "H_kv", "D", "vocab_size", "dtype", "dense_I", "moe",
    "attention", "sliding_window", "quantization",
)  # fmt: skip
MODEL_KEY_DIMS = ("architecture", "L", "H", "I", "h", "H_kv", "D", "vocab_size", "dtype")
PARALLEL_KINDS = ("TP", "DP", "EP", "PP", "SP", "EMB", "A2A")

# Which engine wrote the step markers (derive/step_grammar.py marker sources) or the log (input format).
ENGINE_BY_MARKER = {
    "vllm step annotation": "vLLM",
    "vllm step annotation (detailed)": "vLLM",
    "execute_model frame": "vLLM",
    "sglang step span": "SGLang",
    "tensorrt-llm executor step": "TensorRT-LLM",
}
ENGINE_BY_FORMAT = {"vllm-log": "vLLM", "sglang-log": "SGLang"}
VERSION_FACTS = {"vllm_version": "vLLM", "sglang_version": "SGLang"}  # serving_startup keys

_STEPS_SQL = "SELECT coalesce(phase, 'unphased') AS phase, T, marker_source, dur_ns FROM steps"
_BENCH_SQL = """
SELECT model_id, dataset_name, num_prompts, request_rate_rps, burstiness, max_concurrency, completed,
    total_input_tokens, total_output_tokens
FROM bench_runs ORDER BY input_id, run"""
_STARTUP_SQL = "SELECT key, value FROM serving_startup ORDER BY input_id, line"
_LOG_LOAD_SQL = """
SELECT count(*) AS lines, median(running) AS running_median, median(waiting) AS waiting_median,
    avg(prompt_tput_tok_s) AS prompt_tput_tok_s_mean, avg(gen_tput_tok_s) AS gen_tput_tok_s_mean
FROM serving_stats"""


class _Source:
    """Rows of a run: from its store when there is one, else from findings.json's report sections."""

    def __init__(self, run: RunData) -> None:
        self.doc = run.doc
        self.con = None
        if run.db_path is not None and Path(run.db_path).is_file():
            self.con = open_read_back(run.db_path)  # data, not code: a diff input may come from anywhere

    def close(self) -> None:
        if self.con is not None:
            self.con.close()

    def _table(self, section: str, caption: str) -> list[dict[str, Any]]:
        s = (self.doc.get("sections") or {}).get(section) or {}
        return list((s.get("tables") or {}).get(caption) or [])

    def _sql(self, sql: str, table: str) -> list[dict[str, Any]] | None:
        if self.con is None:
            return None
        known = self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]
        ).fetchone()[0]
        if not known:
            return []
        cur = self.con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def steps(self) -> list[dict[str, Any]]:
        rows = self._sql(_STEPS_SQL, "steps")
        return rows if rows is not None else self._table("steps", "steps per rank")

    def bench_runs(self) -> list[dict[str, Any]]:
        rows = self._sql(_BENCH_SQL, "bench_runs")
        return rows if rows is not None else self._table("serving", "benchmark runs")

    def startup_facts(self) -> list[dict[str, Any]]:
        rows = self._sql(_STARTUP_SQL, "serving_startup")
        return rows if rows is not None else self._table("serving", "startup facts")

    def log_load(self) -> dict[str, Any] | None:
        rows = self._sql(_LOG_LOAD_SQL, "serving_stats")
        if rows is None:  # findings.json: the stats lines it shows (all of them for short logs)
            stats = self._table("serving", "engine stats lines")
            if not stats:
                return None
            rows = [_log_load_of(stats)]
        return rows[0] if rows and rows[0]["lines"] else None


def _median(values: list[Any]) -> float | None:
    xs = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(xs) if xs else None


def _mean(values: list[Any]) -> float | None:
    xs = [v for v in values if isinstance(v, (int, float))]
    return statistics.fmean(xs) if xs else None


def _log_load_of(stats: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "lines": len(stats),
        "running_median": _median([r.get("running") for r in stats]),
        "waiting_median": _median([r.get("waiting") for r in stats]),
        "prompt_tput_tok_s_mean": _mean([r.get("prompt_tput_tok_s") for r in stats]),
        "gen_tput_tok_s_mean": _mean([r.get("gen_tput_tok_s") for r in stats]),
    }


def config_hash(model: dict[str, Any]) -> str:
    """sha256 (first 16 hex digits) of the model's identity fields as findings.json holds them: the same model
    read from two copies of its config.json hashes the same; any change of shape, dtype or quantization does not."""
    ident = {k: model.get(k) for k in MODEL_IDENTITY}
    return hashlib.sha256(orjson.dumps(ident, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()[:16]


def _model(doc: dict[str, Any]) -> dict[str, Any] | None:
    m = doc.get("model")
    if not isinstance(m, dict):
        return None
    schemes = {g.get("group"): g.get("scheme") for g in m.get("quantization_groups") or [] if isinstance(g, dict)}
    return {"config_hash": config_hash(m), **{k: m.get(k) for k in MODEL_KEY_DIMS}, "quantization": schemes or None,
            "path": m.get("path")}  # fmt: skip


def _layout(doc: dict[str, Any]) -> dict[str, Any] | None:
    tp = (doc.get("tp") or {}).get("p")
    groups: dict[str, int] = {}
    for g in (doc.get("layout") or {}).get("groups") or []:
        if g.get("kind") in PARALLEL_KINDS and isinstance(g.get("size"), int):
            groups[g["kind"]] = max(groups.get(g["kind"], 0), g["size"])
    inputs = doc.get("inputs") or []
    ranks = {r for i in inputs for r in i.get("ranks") or []}
    worlds = [i["world_size"] for i in inputs if isinstance(i.get("world_size"), int)]
    if tp is None and not groups and not ranks:
        return None
    return {
        "tp": tp,
        "groups": dict(sorted(groups.items())),
        "ranks": len(ranks),
        "world_size": max(worlds, default=None),
    }


def _gpu(doc: dict[str, Any]) -> list[str] | None:
    names = sorted({i["device"] for i in doc.get("inputs") or [] if i.get("device")})
    return names or None


def _engine(doc: dict[str, Any], steps: list[dict[str, Any]], facts: list[dict[str, Any]]) -> dict[str, Any] | None:
    names: dict[str, str] = {}  # engine -> where it was seen
    for s in steps:
        name = ENGINE_BY_MARKER.get(s.get("marker_source") or "")
        if name:
            names.setdefault(name, f"step markers ({s['marker_source']})")
    for i in doc.get("inputs") or []:
        name = ENGINE_BY_FORMAT.get(i.get("format") or "")
        if name:
            names.setdefault(name, f"{i['format']} input")
    versions = {}
    for f in facts:
        name = VERSION_FACTS.get(f.get("key") or "")
        if name and f.get("value"):
            versions.setdefault(name, str(f["value"]))
            names.setdefault(name, f"startup fact {f['key']}")
    if not names:
        return None
    name = sorted(names)[0] if len(names) == 1 else " + ".join(sorted(names))
    version = versions.get(name) if len(names) == 1 else None
    return {"name": name, "version": version, "source": "; ".join(names[n] for n in sorted(names))}


def _step_shapes(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Share of steps per phase and the median tokens per step (T) of each phase, over marked steps."""
    marked = [s for s in steps if s.get("marker_source") != WHOLE_TRACE and s.get("dur_ns")]
    if not marked:
        return None
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for s in marked:
        by_phase.setdefault(s.get("phase") or "unphased", []).append(s)
    return {
        "steps": len(marked),
        "phase_mix": {p: len(rows) / len(marked) for p, rows in sorted(by_phase.items())},
        "T_median": {p: _median([r.get("T") for r in rows]) for p, rows in sorted(by_phase.items())},
    }


def _per_request(total: Any, completed: Any) -> float | None:
    ok = isinstance(total, (int, float)) and isinstance(completed, (int, float)) and completed > 0
    return total / completed if ok else None


def _workload(bench: list[dict[str, Any]], log_load: dict[str, Any] | None) -> dict[str, Any] | None:
    """The load the run served: the benchmark client's parameters (what was asked of the server), else what
    the engine's stats lines saw (what the server did)."""
    if bench:
        runs = [
            {
                "model_id": b.get("model_id"),
                "dataset": b.get("dataset_name"),
                "num_prompts": b.get("num_prompts"),
                "request_rate_rps": b.get("request_rate_rps"),
                "max_concurrency": b.get("max_concurrency"),
                "mean_input_len": _per_request(b.get("total_input_tokens"), b.get("completed")),
                "mean_output_len": _per_request(b.get("total_output_tokens"), b.get("completed")),
            }
            for b in bench
        ]
        return {"source": "benchmark results", "runs": runs}
    if log_load:
        return {"source": "engine stats lines"} | {k: v for k, v in log_load.items()}
    return None


def _fitness(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The trace's fitness for diagnosis when findings.json says (a `fitness` field; older runs have none), else
    a verdict that says the run cannot be judged. `fit` is False only when the run says it is unfit."""
    f = doc.get("fitness")
    status = reason = None
    fit = None
    if isinstance(f, str):
        status = f
    elif isinstance(f, dict):
        # findings.json writes `class` and `why` (tracediag/derive/fitness.py); the other keys are older spellings
        status = f.get("class") or f.get("status") or f.get("verdict") or f.get("level")
        fit = f.get("fit") if isinstance(f.get("fit"), bool) else None
        reason = f.get("why") or f.get("reason") or f.get("summary") or f.get("headline")
    v = doc.get("verdict") or {}
    # a verdict left open by a rule's own evidence (`undetermined`: SLO attainment between its bounds) says nothing
    # about the trace's fitness
    if status is None and v.get("status") in ("inconclusive", "undetermined") and not v.get("undetermined"):
        status, reason = v["status"], v.get("headline")
    if status is None and fit is None:
        return None
    if fit is None:
        fit = str(status).lower() not in UNFIT_STATUSES
    return {"status": status, "fit": fit, "reason": reason}


UNFIT_STATUSES = ("unfit", "not_fit", "inconclusive", "undetermined")


def fingerprint(run: RunData) -> dict[str, Any]:
    """{model, layout, gpu, engine, step_shapes, workload, fitness} of one run; None where a fact is unknown."""
    src = _Source(run)
    try:
        steps = src.steps()
        return {
            "model": _model(run.doc),
            "layout": _layout(run.doc),
            "gpu": _gpu(run.doc),
            "engine": _engine(run.doc, steps, src.startup_facts()),
            "step_shapes": _step_shapes(steps),
            "workload": _workload(src.bench_runs(), src.log_load()),
            "fitness": _fitness(run.doc),
        }
    finally:
        src.close()
