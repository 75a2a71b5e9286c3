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
        self.unchecked: dict[str, str] = {}  # aspect -> why it was not checked
        self.aspect = ""  # the aspect being judged (set by `comparability`)

    def skip(self, label: str, why: str) -> None:
        """The aspect could not be judged: it counts as not checked, never as a match."""
        self.not_checked.append(f"{label} ({why})")
        self.unchecked.setdefault(self.aspect, why)

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
        self.unchecked.setdefault(self.aspect, f"not known for {side}" + (f": {why}" if why else ""))
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
    if not j.both(b, a, "parallel layout", "no TP degree, layout groups or ranks in the inputs"):
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
        j.skip("serving workload", f"BEFORE from {b['source']}, AFTER from {a['source']}: not the same measure")
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
    j.both(b, a, "trace fitness", "no fitness in findings.json: no trace given, or an older tracediag")
    for side, f in (("BEFORE", b), ("AFTER", a)):
        if f is not None and f["fit"] is False:
            why = f": {f['reason']}" if f.get("reason") else ""
            j.differ("fitness", f"{side} trace is unfit for diagnosis ({f['status']}){why}", f, None, True)
    if b is not None and a is not None and b["fit"] and a["fit"] and b["status"] != a["status"]:
        j.differ("fitness", f"trace fitness {b['status']} → {a['status']}", b["status"], a["status"], False)


ASPECTS = (
    ("model", "model", _model),
    ("layout", "parallel layout", _layout),
    ("gpu", "GPU", _gpu),
    ("engine", "engine", _engine),
    ("step_shapes", "step shapes", _step_shapes),
    ("workload", "serving load", _workload),
    ("fitness", "trace fitness", _fitness),
)
# The aspect a roofline-normalised comparison removes: % of each GPU's own roofline compares across GPUs.
ROOFLINE_NORMALISED = ("gpu",)


def _aspect_rows(j: _Judge) -> list[dict[str, Any]]:
    """Each aspect's status: 'not comparable' (an invalidating difference), 'differs' (stated, not invalidating),
    'same', or 'not checked' (a side lacks the fact), with why."""
    rows = []
    for name, label, _ in ASPECTS:
        diffs = [d for d in j.differences if d["aspect"] == name]
        if any(d["invalidates"] for d in diffs):
            status, why = "not comparable", "; ".join(d["what"] for d in diffs if d["invalidates"])
        elif name in j.unchecked:
            status, why = "not checked", j.unchecked[name]
        elif diffs:
            status, why = "differs", "; ".join(d["what"] for d in diffs)
        else:
            status, why = "same", None
        rows.append({"aspect": name, "label": label, "status": status, "why": why})
    return rows


def summary(comp: dict[str, Any]) -> str:
    """'comparable on N of 7 aspects; not checked: X (why), ...' or the verdict with what was checked."""
    aspects = comp["aspects"]
    checked = [a for a in aspects if a["status"] != "not checked"]
    skipped = ", ".join(f"{a['label']} ({a['why']})" for a in aspects if a["status"] == "not checked")
    tail = f"; not checked: {skipped}" if skipped else ""
    if comp["comparable"]:
        n = "all" if len(checked) == len(aspects) else str(len(checked))
        return f"comparable on {n} of {len(aspects)} aspects" + tail
    return f"{comp['verdict']} ({len(checked)} of {len(aspects)} aspects checked{tail})"


def comparability(before: dict[str, Any], after: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """{comparable, verdict, forced, differences: [{aspect, what, before, after, invalidates}], not_checked,
    aspects: [{aspect, label, status, why}], checked, summary, efficiency_comparable, efficiency_verdict}.

    `verdict` is "comparable" or "not comparable: <each invalidating difference>"; `summary` says on how many of the
    7 aspects that rests and names each one not checked, with why; `force` (diff --force-compare) keeps the verdict
    but lets the diff report its changes anyway (`forced`). `efficiency_*` is the verdict for the per-op
    efficiency section (% of each GPU's own roofline), which another GPU does not invalidate."""
    j = _Judge()
    for name, _, judge in ASPECTS:
        j.aspect = name
        judge(j, before.get(name), after.get(name))
    blocking = [d["what"] for d in j.differences if d["invalidates"]]
    # per-op efficiency (% of each GPU's own roofline) is blocked only by what the roofline does not normalise
    eff_blocking = [d["what"] for d in j.differences if d["invalidates"] and d["aspect"] not in ROOFLINE_NORMALISED]
    comp = {
        "comparable": not blocking,
        "verdict": "not comparable: " + "; ".join(blocking) if blocking else "comparable",
        "forced": bool(force and blocking),
        "differences": j.differences,
        "not_checked": j.not_checked,
        "aspects": _aspect_rows(j),
        "efficiency_comparable": not eff_blocking,
        "efficiency_verdict": "not comparable: " + "; ".join(eff_blocking) if eff_blocking else "comparable",
    }
    comp["checked"] = sum(a["status"] != "not checked" for a in comp["aspects"])
    comp["summary"] = summary(comp)
    return comp
