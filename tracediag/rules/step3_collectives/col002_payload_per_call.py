"""COL002 Payload per call.

Hypothesis: each TP all-reduce sums the [T, H] activation, so its payload is S = T·H·e_a bytes with
e_a the element size of the *communicated activation* (read from the trace, never from the weight
format: 4-bit weights do not shrink e_a). A ratio of 2 with fp32 means activations are upcast for
communication; ≈ p or ≈ 1/p means a wrong split; anything else means the payload is not the
[T, H] activation and the simple cost model does not apply.

Formula: ratio = payload_bytes / (T·H·e_a), payload_bytes = elements × element size of the call.
With sequence parallelism (COL001) the calls are the TP group's reduce-scatters and all-gathers and the
payload is the full [T, H] side of each: a reduce-scatter's input, an all-gather's output (p × its input
shard); the vocab-parallel logits all-gather ([n, V/p] → [n, V]) is not an activation call and is left out.

Padded calls: an all-reduce whose tensor is wider than H (an MLP or MoE kernel that works on H rounded up, say
2880 → 3072, returns its padded output and the model reduces that) moves width/H times the bytes; within the
tolerance it still counts as matching, and the finding or pass says how many calls are padded, to which width and
at what extra share of bytes.

Evidence: per rank and step, T (from the step), the expected and observed bytes, the ratio, the
dtype, and example calls with where their size came from (record_param_comms args, kernel args, op
input shapes).

What to do: on an fp32 ratio, find the upcast before the all-reduce (a .float() in the model code,
an fp32 reduce option, a custom op that upcasts); on a p or 1/p ratio, check the sharding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tracediag.analyses.tp_collectives import (
    SEQUENCE_PARALLEL,
    activation_element_bytes,
    tp_allreduce_where,
    tp_scheme,
    tp_sp_where,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="COL002",
    step=3,
    title="All-reduce payload = T·H·e_a",
    requires_tables=("collectives", "steps"),
    requires_model=("H",),
    requires_tp=True,
    may_be_downstream_of=("SHP001", "SHP002", "COL001"),
)
MATCH_SHARE = 0.9  # share of calls within tolerance for a pass


def _category(ratio: float, dtype: str | None, e_a: int, p: int, tol: float) -> str:
    def near(x: float) -> bool:
        return abs(ratio / x - 1) <= tol

    if near(1):
        return "match"
    if dtype == "fp32" and e_a == 2 and near(2):
        return "fp32 upcast (2×)"
    if near(2):
        return "2× (larger element type)"
    if p > 1 and near(p):
        return f"p× ({p}×: unsharded or gathered)"
    if p > 1 and near(1 / p):
        return f"1/p (1/{p}: sharded activation)"
    return "other"


def check(ctx: Context) -> Check:
    """The check, once per memoized stretch of the rules (COL003 asks for it again for its cost-model verdict)."""
    return ctx.once(("check", RULE.id), lambda: _check(ctx))


def _check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ctx, ms)


def _tp_calls(ctx: Context, p: int, sp: bool) -> tuple[list[dict], int]:
    """The TP collectives inside engine steps, with their step's T; the logits all-gathers left out (SP)."""
    calls = ctx.rows(
        f"SELECT c.rank, c.step_id, c.ts_ns, c.call_name, coalesce(c.kernel_name, c.exec_name) AS work_event, "
        f"c.op, c.dtype, c.elements, c.in_width, c.payload_bytes, coalesce(c.group_size, ?) AS group_size,"
        f" c.evidence, s.T, s.phase FROM collectives c JOIN steps s USING (rank, step_id) "
        f"WHERE {tp_sp_where('c') if sp else tp_allreduce_where('c')} ORDER BY c.rank, c.ts_ns",
        [p, p],
    )
    if sp:
        return _full_side(calls, ctx.model.vocab_size, ctx.model.H)
    return calls, 0


def _step_table(sized: list[dict]) -> list[dict]:
    """One row per (rank, step): its T, expected bytes, the payloads and dtypes seen and the calls' categories."""
    steps: dict[tuple, dict] = {}
    for c in sized:
        s = steps.get((c["rank"], c["step_id"]))
        if s is None:  # not setdefault: its default (a Counter and two sets) would be built for every call
            s = steps[(c["rank"], c["step_id"])] = {
                "rank": c["rank"],
                "step": c["step_id"],
                "phase": c["phase"],
                "T": c["T"],
                "expected_bytes": c["expected_bytes"],
                "calls": 0,
                "payload_bytes": set(),
                "dtypes": set(),
                "categories": Counter(),
            }
        s["calls"] += 1
        s["payload_bytes"].add(c["payload_bytes"])
        s["dtypes"].add(c["dtype"])
        s["categories"][c["category"]] += 1
    return [
        s
        | {
            "payload_bytes": sorted(s["payload_bytes"]),
            "dtypes": sorted(d or "?" for d in s["dtypes"]),
            "ratio": round(max(s["payload_bytes"]) / s["expected_bytes"], 3),
            "categories": dict(s["categories"]),
        }
        for s in steps.values()
    ]


@dataclass(frozen=True)
class PayloadMeasure:
    """COL002's numbers: each sized call's ratio to T·H·e_a and category, counted, and per step."""

    e_a: int
    sp: bool
    what: str
    sized: list[dict]
    cats: Counter
    matched: int
    share: float
    padded: Counter  # calls reduced at a width above H (a padded hidden size), by width
    table: list[dict]
    values: dict


def _values(ctx: Context, ms_parts: dict) -> dict:
    m, p, sized, cats, e_a, sp = (
        ctx.model,
        ctx.tp.p,
        ms_parts["sized"],
        ms_parts["cats"],
        ms_parts["e_a"],
        ms_parts["sp"],
    )
    ex = sized[0]
    values = {
        "H": m.H,
        "e_a": e_a,
        "e_a_source": ms_parts["e_a_source"],
        "p": p,
        "tolerance": ctx.settings.payload_tolerance,
        "calls_checked": len(sized),
        "calls_without_size_or_T": ms_parts["n_calls"] - len(sized),
        "calls_matching": ms_parts["matched"],
        "matching_share": ms_parts["share"],
        "categories": dict(cats),
        "example_T": ex["T"],
        "example_expected_bytes": ex["expected_bytes"],
        "example_payload_bytes": ex["payload_bytes"],
        "example_ratio": ex["ratio"],
        "scheme": "sequence-parallel (payload = the full [T, H] side of each call)" if sp else "all-reduce",
    }
    if sp:
        values["logits_all_gathers_left_out"] = ms_parts["logits"]
    padded = ms_parts["padded"]
    if padded:
        width = padded.most_common(1)[0][0]
        values |= {
            "padded_calls": sum(padded.values()),
            "padded_widths": dict(sorted(padded.items())),
            "padded_extra_bytes_share": round(width / m.H - 1, 4),
        }
    if m.weight_bits and m.weight_bits < 16:
        values["note"] = (
            f"the config quantizes weights to {m.weight_bits} bits; that does not shrink e_a — "
            "the all-reduce sums activations"
        )
    return values


def measure(ctx: Context) -> PayloadMeasure | str:
    """Every number COL002 judges by, or the reason (a string) it does not apply."""
    m, p, tol = ctx.model, ctx.tp.p, ctx.settings.payload_tolerance
    if p == 1:
        return f"p = 1 ({ctx.tp.source}): no tensor-parallel all-reduces to size"
    e_a, e_a_source = activation_element_bytes(ctx)
    if e_a is None:
        return f"missing activation element type: no GEMM input types in the trace and no torch_dtype in {m.path}"
    sp = tp_scheme(ctx, p) == SEQUENCE_PARALLEL
    calls, logits = _tp_calls(ctx, p, sp)
    what = "reduce-scatter / all-gather" if sp else "all-reduce"
    if not calls:
        return f"missing TP {what} calls inside engine steps"
    sized = [c for c in calls if c["payload_bytes"] is not None and c["T"]]
    if not sized:
        why = (
            "no step has T"
            if all(c["T"] is None for c in calls)
            else "no call recorded its size (no record_param_comms args, kernel args or input shapes)"
        )
        return f"missing payload or T: {why}"
    for c in sized:
        c["expected_bytes"] = c["T"] * m.H * e_a
        c["ratio"] = c["payload_bytes"] / c["expected_bytes"]
        c["category"] = _category(c["ratio"], c["dtype"], e_a, p, tol)
    cats = Counter(c["category"] for c in sized)
    matched = cats.get("match", 0)
    padded = Counter(c["in_width"] for c in sized if c["in_width"] and c["in_width"] > m.H and not sp)
    share = matched / len(sized)
    table = _step_table(sized)
    parts = {
        "sized": sized,
        "cats": cats,
        "e_a": e_a,
        "e_a_source": e_a_source,
        "sp": sp,
        "n_calls": len(calls),
        "matched": matched,
        "share": share,
        "logits": logits,
        "padded": padded,
    }
    return PayloadMeasure(e_a, sp, what, sized, cats, matched, share, padded, table, _values(ctx, parts))


def _evidence(ctx: Context, rows: list[dict]) -> list[dict]:
    return [
        {
            "rank": c["rank"],
            "step": c["step_id"],
            "ts_ns": c["ts_ns"],
            "name": c["call_name"],
            "work_event": c["work_event"],
            "dtype": c["dtype"],
            "elements": c["elements"],
            "payload_bytes": c["payload_bytes"],
            "T": c["T"],
            "ratio": round(c["ratio"], 4),
            "size_from": c["evidence"],
        }
        for c in rows[: ctx.settings.max_evidence]
    ]


def _substituted(H: int, e_a: int, c: dict, prefix: str) -> str:
    return (
        f"{prefix}rank {c['rank']} step {c['step_id']}: {c['payload_bytes']:,} / "
        f"({c['T']}×{H}×{e_a} = {c['expected_bytes']:,}) = {c['ratio']:.3f}"
    )


def judge(ctx: Context, ms: PayloadMeasure) -> Check:
    """Status, severity and words from COL002's numbers."""
    H, e_a, sized, what, padded = ctx.model.H, ms.e_a, ms.sized, ms.what, ms.padded
    pad_note = ""
    if padded:
        width = padded.most_common(1)[0][0]
        pad_note = (
            f"; {sum(padded.values())} of {len(sized)} padded to width {width} (H = {H}: "
            f"+{width / H - 1:.1%} bytes per call)"
        )
    formula = "ratio = payload_bytes / (T·H·e_a)"
    if ms.share >= MATCH_SHARE:
        return passed(
            RULE,
            confidence="high",
            title=f"{ms.matched} of {len(sized)} {what} payloads = T·H·e_a (e_a = {e_a} B)"
            + (" (sequence parallelism: reduce-scatter input, all-gather output)" if ms.sp else "")
            + pad_note,
            formula=formula,
            substituted=_substituted(H, e_a, sized[0], "e.g. "),
            values=ms.values,
            table=ms.table,
            evidence=_evidence(ctx, sized),
            cost_model_applies=True,
        )
    worst = next(k for k, _ in ms.cats.most_common() if k != "match")
    bad = [c for c in sized if c["category"] == worst]
    if worst.startswith("fp32 upcast"):
        title = (
            f"All-reduce runs in fp32: payload is 2× T·H·e_a in {len(bad)} of {len(sized)} calls "
            "(activations upcast for communication)"
        )
        nxt = (
            "Find the .float()/fp32 upcast before the all-reduce (model code, custom op, reduce option): "
            "it doubles bus bytes and time per call."
        )
    else:
        title = f"{what.capitalize()} payload is {worst} of T·H·e_a in {len(bad)} of {len(sized)} calls{pad_note}"
        nxt = "Check the sharding and what tensor is reduced; compare with the GEMM shapes (SHP002)."
    return finding(
        RULE,
        severity="warning",
        confidence="high",
        impact=len(bad) / len(sized),
        title=title,
        formula=formula,
        substituted=_substituted(H, e_a, bad[0], ""),
        values=ms.values,
        table=ms.table,
        evidence=_evidence(ctx, bad),
        next_check=nxt + " The 2L·τ_AR(T·H·e_a) cost model does not apply until the payload is T·H·e_a.",
        cost_model_applies=False,
    )


def _full_side(calls: list[dict], vocab: int | None, H: int) -> tuple[list[dict], int]:
    """Sequence-parallel calls with payload_bytes set to their full [T, H] side; the logits all-gather left out.

    A reduce-scatter's recorded elements are its input (the [T, H] partial sums); an all-gather's are its input
    shard, so the full side is p × that. The logits all-gather gathers [n, V/p] shards of the vocab-parallel
    lm_head: its input is V/p wide, not H."""
    out, logits = [], 0
    for c in calls:
        if c["op"] == "all_gather" and c["elements"] is not None:
            full = c["elements"] * c["group_size"]
            width = c["in_width"]
            if vocab and width and width != H and width * c["group_size"] == vocab:
                logits += 1
                continue
            if c["payload_bytes"] is not None:
                c = c | {"payload_bytes": c["payload_bytes"] * c["group_size"], "elements": full}
        out.append(c)
    return out, logits
