"""Whether two runs can be compared: their fingerprints side by side, each difference named, and the verdict.

A difference **invalidates** the comparison when it changes the work itself, so that a run being slower says
nothing about a regression: another model, another parallel layout, another GPU, steps of another shape (phase
mix, tokens per step), another load asked of the server (request rate, concurrency, prompt and output lengths,
dataset), or a trace that is unfit for diagnosis. Other differences are stated but do not invalidate it: an
engine or its version (comparing those is what a regression hunt does), the number of rank files given, and what
the engine's stats lines saw (queue, running requests, throughput: a slower server changes them too, so they
cannot tell another load from a regression). A fact one side lacks is listed as not checked, never as a match.
docs/method.md ("Comparing two runs") states the same rules with their thresholds.
"""

from __future__ import annotations

import math
from typing import Any

# Thresholds (docs/method.md): a smaller gap is the noise of two recordings of the same set-up.
PHASE_MIX_POINTS = 0.25  # the share of steps in one phase differs by more than 25 points
T_RATIO = 2.0  # a phase's median tokens per step differs by more than 2x (another batch size, another cost per step)
RATE_REL = 0.10  # request rate, mean prompt and output length: more than 10 % apart
LOG_LOAD_REL = 0.5  # stats-line load: more than 50 % apart is worth stating (it never invalidates)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _differ_rel(a: Any, b: Any, rel: float) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isinf(a) or math.isinf(b):
            return a != b
        return abs(a - b) > rel * max(abs(a), abs(b))
    return a != b


class _Judge:
    def __init__(self) -> None:
        self.differences: list[dict[str, Any]] = []
        self.not_checked: list[str] = []

    def differ(self, aspect: str, what: str, before: Any, after: Any, blocking: bool) -> None:
        self.differences.append(
            {"aspect": aspect, "what": what, "before": before, "after": after, "invalidates": blocking}
        )

    def both(self, b: Any, a: Any, label: str, why: str = "") -> bool:
        """True when both sides know the fact; otherwise record that it was not checked, and why."""
        if b is not None and a is not None:
            return True
        side = "either run" if b is None and a is None else ("BEFORE" if b is None else "AFTER")
        self.not_checked.append(f"{label}: not known for {side}" + (f" ({why})" if why else ""))
        return False


def _model(j: _Judge, b: dict | None, a: dict | None) -> None:
    if not j.both(b, a, "model", "no --model config.json"):
        return
    if b["config_hash"] == a["config_hash"]:
        return
    dims = [f"{k} {_fmt(b[k])} → {_fmt(a[k])}" for k in b if k not in ("config_hash", "path") and b[k] != a.get(k)]
    what = ", ".join(dims) if dims else "config differs outside the key dimensions"
    j.differ("model", f"model: {what} (config hash {b['config_hash']} → {a['config_hash']})", b, a, True)


def _layout(j: _Judge, b: dict | None, a: dict | None) -> None:
    if not j.both(b, a, "parallel layout"):
        return
    if b["tp"] is not None and a["tp"] is not None and b["tp"] != a["tp"]:
        j.differ("layout", f"TP {b['tp']} → {a['tp']}", b["tp"], a["tp"], True)
    for kind in sorted((set(b["groups"]) | set(a["groups"])) - {"TP"}):
        x, y = b["groups"].get(kind), a["groups"].get(kind)
        if x != y:
            j.differ("layout", f"{kind} group size {_fmt(x)} → {_fmt(y)}", x, y, True)
    tp_differs = any(d["what"].startswith("TP ") for d in j.differences)
    if b["world_size"] and a["world_size"] and b["world_size"] != a["world_size"] and not tp_differs:
        j.differ("layout", f"world size {b['world_size']} → {a['world_size']}", b["world_size"], a["world_size"], True)
    if b["ranks"] != a["ranks"]:
        j.differ("layout", f"rank files given {b['ranks']} → {a['ranks']}", b["ranks"], a["ranks"], False)


def _gpu(j: _Judge, b: list | None, a: list | None) -> None:
    if j.both(b, a, "GPU", "no device name in the inputs") and b != a:
        j.differ("gpu", f"GPU {', '.join(b)} → {', '.join(a)}", b, a, True)


def _engine(j: _Judge, b: dict | None, a: dict | None) -> None:
    if not j.both(b, a, "engine", "no engine step markers, log or startup facts"):
        return
    if b["name"] != a["name"]:
        j.differ("engine", f"engine {b['name']} → {a['name']}", b["name"], a["name"], False)
    elif b["version"] and a["version"] and b["version"] != a["version"]:
        j.differ("engine", f"{b['name']} version {b['version']} → {a['version']}", b["version"], a["version"], False)


def _step_shapes(j: _Judge, b: dict | None, a: dict | None) -> None:
    if not j.both(b, a, "step shapes", "no step markers"):
        return
    for phase in sorted(set(b["phase_mix"]) | set(a["phase_mix"])):
        x, y = b["phase_mix"].get(phase, 0.0), a["phase_mix"].get(phase, 0.0)
        if abs(x - y) > PHASE_MIX_POINTS:
            j.differ("step_shapes", f"{phase} steps {x * 100:.0f}% → {y * 100:.0f}% of steps", x, y, True)
        tx, ty = b["T_median"].get(phase), a["T_median"].get(phase)
        if tx and ty and max(tx, ty) / min(tx, ty) > T_RATIO:
            j.differ("step_shapes", f"median T of {phase} steps {_fmt(tx)} → {_fmt(ty)}", tx, ty, True)


BENCH_BLOCKING = (
    ("model_id", "served model id"),
    ("dataset", "dataset"),
    ("request_rate_rps", "request rate (req/s)"),
    ("max_concurrency", "max concurrency"),
    ("mean_input_len", "mean input length (tokens)"),
    ("mean_output_len", "mean output length (tokens)"),
)
LOG_LOAD = (
    ("running_median", "median running requests"),
    ("waiting_median", "median waiting requests"),
    ("prompt_tput_tok_s_mean", "mean prompt throughput (tokens/s)"),
    ("gen_tput_tok_s_mean", "mean generation throughput (tokens/s)"),
)


def _workload(j: _Judge, b: dict | None, a: dict | None) -> None:
    if not j.both(b, a, "serving workload", "no benchmark result or engine stats lines"):
        return
    if b["source"] != a["source"]:
        j.not_checked.append(f"serving workload (BEFORE from {b['source']}, AFTER from {a['source']})")
        return
    if b["source"] == "benchmark results":
        rb, ra = b["runs"], a["runs"]
        if len(rb) != len(ra):
            j.differ("workload", f"benchmark runs {len(rb)} → {len(ra)}", len(rb), len(ra), True)
            return
        for i, (x, y) in enumerate(zip(rb, ra)):
            at = f" (run {i})" if len(rb) > 1 else ""
            for key, label in BENCH_BLOCKING:
                vx, vy = x.get(key), y.get(key)
                if key == "max_concurrency":  # None is "no cap": a setting of its own
                    differs = vx != vy
                elif key in ("model_id", "dataset"):
                    differs = vx is not None and vy is not None and vx != vy
                else:
                    differs = _differ_rel(vx, vy, RATE_REL)
                if differs:
                    shown = [("no cap" if v is None and key == "max_concurrency" else _fmt(v)) for v in (vx, vy)]
                    j.differ("workload", f"{label} {shown[0]} → {shown[1]}{at}", vx, vy, True)
            if x.get("num_prompts") != y.get("num_prompts"):
                j.differ("workload", f"requests {_fmt(x.get('num_prompts'))} → {_fmt(y.get('num_prompts'))}{at}",
                         x.get("num_prompts"), y.get("num_prompts"), False)  # fmt: skip
        return
    for key, label in LOG_LOAD:
        if _differ_rel(b.get(key), a.get(key), LOG_LOAD_REL):
            j.differ("workload", f"{label} {_fmt(b.get(key))} → {_fmt(a.get(key))}", b.get(key), a.get(key), False)


def _fitness(j: _Judge, b: dict | None, a: dict | None) -> None:
    for side, f in (("BEFORE", b), ("AFTER", a)):
        if f is not None and f["fit"] is False:
            why = f": {f['reason']}" if f.get("reason") else ""
            j.differ("fitness", f"{side} trace is unfit for diagnosis ({f['status']}){why}", f, None, True)
    if b is not None and a is not None and b["fit"] and a["fit"] and b["status"] != a["status"]:
        j.differ("fitness", f"trace fitness {b['status']} → {a['status']}", b["status"], a["status"], False)


ASPECTS = (
    ("model", _model),
    ("layout", _layout),
    ("gpu", _gpu),
    ("engine", _engine),
    ("step_shapes", _step_shapes),
    ("workload", _workload),
    ("fitness", _fitness),
)


def comparability(before: dict[str, Any], after: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """{comparable, verdict, forced, differences: [{aspect, what, before, after, invalidates}], not_checked}.

    `verdict` is "comparable" or "not comparable: <each invalidating difference>"; `force` (diff
    --force-compare) keeps the verdict but lets the diff report its changes anyway (`forced`)."""
    j = _Judge()
    for name, judge in ASPECTS:
        judge(j, before.get(name), after.get(name))
    blocking = [d["what"] for d in j.differences if d["invalidates"]]
    return {
        "comparable": not blocking,
        "verdict": "not comparable: " + "; ".join(blocking) if blocking else "comparable",
        "forced": bool(force and blocking),
        "differences": j.differences,
        "not_checked": j.not_checked,
    }
