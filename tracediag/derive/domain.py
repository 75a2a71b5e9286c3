"""The workload's domain: training or inference, and LLM or another kind of model — from what the trace holds.

Table `workload_domain` (workload_domain.sql: one row for the analysis), built beside the window fitness
(derive/fitness.py), which reports it (findings.json `fitness.domain`, the report header):

* **mode** — `training` when the trace holds an autograd backward pass or optimizer work (`training_evidence`,
  which derive/layout.py's `workload` shares: `autograd::engine::evaluate_function…`, `*Backward*` ops, FSDP2's
  post-backward hook (applied in a forward pass only while autograd records for a backward one: a window of forward
  passes alone is still training), `Optimizer.step#…` / `Optimizer.zero_grad#…`, DDP's annotations;
  `aten::_foreach_*` ops are counted but alone prove nothing: inference engines run them too); `inference` when it holds
  inference-engine step annotations (vLLM `execute_…`, SGLang `step[…]`), or no backward pass at all beside LLM
  attention; else `unknown`;
* **workload** — `llm` when attention kernels of a catalogued family or attention ops ran, or engine steps;
  `recommender` when embedding-bag ops or kernels ran (TorchRec / FBGEMM `embedding_bag`, table-batched
  embeddings) — checked first, a recommender may hold attention too; `vision` when convolutions ran and no
  attention; else `other`.

Rules fit their advice to it: engine advice (vLLM, SGLang, FlashInfer) only for LLM inference, and the parallel
layout names an all-to-all from the same evidence (derive/layout.py).
"""

from __future__ import annotations

from typing import Any

import duckdb

from tracediag.store import query_dicts, run_sql_file

COLUMNS = (
    "mode",
    "mode_why",
    "workload",
    "workload_why",
    "backward_ops",
    "optimizer_marks",
    "foreach_ops",
    "engine_steps",
    "attention_kernels",
    "attention_ops",
    "embedding_bag_ops",
    "conv_ops",
    "moe_kernels",
)  # fmt: skip  (the columns of workload_domain.sql, in order)

# CPU ops and kernels are counted per distinct name (and class, family) first: a trace repeats a few thousand names
# hundreds of thousands of times, and each pattern is then matched once per name, not once per event
_COUNTS_SQL = r"""
WITH ops AS MATERIALIZED (SELECT name, count(*) AS n FROM cpu_ops GROUP BY name),
kn AS MATERIALIZED (SELECT name, klass, family, count(*) AS n FROM kernels GROUP BY name, klass, family)
SELECT
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE name LIKE 'aten::\_foreach\_%' ESCAPE '\') AS foreach_ops,
  (SELECT count(*) FROM annotations
     WHERE name LIKE 'execute\_%' ESCAPE '\' OR name LIKE '%step[%') AS engine_steps,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE klass IN ('attention', 'attention_fallback')) AS attention_kernels,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE regexp_matches(name,
     '(?i)scaled_dot_product_attention|flash_attn|unified_attention|::attention|_attention_forward|paged_attention'))
     AS attention_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops
     WHERE regexp_matches(name, '(?i)embedding_bag|torchrec|split_embedding|fbgemm::'))
   + (SELECT coalesce(sum(n), 0)::BIGINT FROM kn
     WHERE regexp_matches(name, '(?i)embedding_bag|split_embedding|batched_embedding')) AS embedding_bag_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE regexp_matches(name, '(?i)^aten::(?:cudnn_|miopen_)?conv'))
     AS conv_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE family IN
     ('ck_moe', 'fused_moe_op', 'moe_routing', 'triton_fused_moe', 'trtllm_gen_moe')) AS moe_kernels
"""


def training_evidence(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Counts of autograd backward ops (`backward`), optimizer / DDP annotations (`marks`) and inference-engine
    step annotations (`engine`) in the store."""
    row = con.execute(
        """SELECT
             -- the names matched once each, not once per op
             (SELECT coalesce(sum(n), 0)::BIGINT FROM (SELECT name, count(*) AS n FROM cpu_ops GROUP BY name)
                 WHERE name LIKE 'autograd::engine::evaluate_function%'
                 OR regexp_matches(name, '^[A-Za-z0-9_]+Backward[0-9]*$')
                 -- FSDP2's post-backward hook, applied in the forward pass only while autograd records for a
                 -- backward one (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
                 -- _register_post_backward_hook returns early when torch.is_grad_enabled() is false or no input
                 -- requires grad): inference under no_grad / inference_mode never records it
                 OR name = 'RegisterPostBackwardFunction') AS backward,
             (SELECT count(*) FROM annotations WHERE name LIKE 'Optimizer.step#%' OR name LIKE 'Optimizer.zero_grad#%'
                 OR name IN ('## backward ##', '## optimizer ##') OR name LIKE 'DistributedDataParallel.%') AS marks,
             (SELECT count(*) FROM annotations
                 WHERE name LIKE 'execute\\_%' ESCAPE '\\' OR name LIKE '%step[%') AS engine"""
    ).fetchone()
    return dict(zip(("backward", "marks", "engine"), row))


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def classify(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The domain row: mode and workload with why in words, and the counts behind them."""
    ev = training_evidence(con)
    row = query_dicts(con, _COUNTS_SQL)[0]
    row |= {"backward_ops": ev["backward"], "optimizer_marks": ev["marks"]}
    attention = row["attention_kernels"] + row["attention_ops"]
    if row["embedding_bag_ops"]:
        work, why = (
            "recommender",
            f"{_count(row['embedding_bag_ops'], 'embedding-bag op or kernel event')} (TorchRec / FBGEMM tables)",
        )
    elif attention or row["engine_steps"]:
        counts = [
            (row["attention_kernels"], "attention kernel"),
            (row["attention_ops"], "attention op"),
            (row["engine_steps"], "engine-step annotation"),
        ]
        work, why = "llm", ", ".join(_count(n, what) for n, what in counts if n)
    elif row["conv_ops"]:
        work, why = "vision", f"{_count(row['conv_ops'], 'convolution op')} and no attention"
    else:
        work, why = "other", "no attention, embedding-bag or convolution work in the trace"
    if ev["backward"] or ev["marks"]:
        counts = [
            (ev["backward"], "autograd backward op"),
            (ev["marks"], "optimizer / DDP annotation"),
            (row["foreach_ops"], "aten::_foreach_* op"),
        ]
        mode, mode_why = "training", ", ".join(_count(n, what) for n, what in counts if n)
    elif row["engine_steps"]:
        mode, mode_why = "inference", "inference-engine steps and no backward pass or optimizer step"
    elif work == "llm":
        mode, mode_why = "inference", "LLM attention and no backward pass or optimizer step"
    else:
        mode, mode_why = "unknown", "no backward pass, optimizer step or engine step annotation"
    return {"mode": mode, "mode_why": mode_why, "workload": work, "workload_why": why} | {
        k: row[k] for k in COLUMNS[4:]
    }


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "workload_domain.sql")
    has_trace = con.execute(
        "SELECT count(*) FROM inputs WHERE format IN ('kineto', 'nsys-sqlite', 'nsys-rep')"
    ).fetchone()[0]
    if not has_trace:
        return
    d = classify(con)
    con.execute(f"INSERT INTO workload_domain VALUES ({', '.join('?' for _ in COLUMNS)})", [d[c] for c in COLUMNS])


def read(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """The domain row, with `label` ('LLM inference', 'vision training', ...); None when there is none."""
    try:
        rows = query_dicts(con, "SELECT * FROM workload_domain")
    except duckdb.CatalogException:
        return None
    if not rows:
        return None
    d = rows[0]
    name = {"llm": "LLM", "recommender": "recommender", "vision": "vision", "other": "non-LLM"}[d["workload"]]
    d["label"] = f"{name} {d['mode']}" if d["mode"] != "unknown" else f"{name} (training or inference unknown)"
    d["llm_inference"] = d["workload"] == "llm" and d["mode"] == "inference"
    return d


def label(d: dict[str, Any] | None) -> str:
    return d["label"] if d else "unknown"
