"""Terminal summary (rich), rendered from the same data as the HTML and JSON: the verdict first, the coverage,
then the findings ranked by impact (consequences indented under their cause), passes and rules that could not
run by id, and where the outputs are.

Titles can quote kernel and annotation names, so they are passed as Text (never markup). When stdout is not a
terminal (CI logs, a pipe) nothing is wrapped: each item stays on one line whatever its length.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

from tracediag.findings import fold
from tracediag.reports.units import percent

_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}
LINE_CHARS = 600  # a title longer than this (a hostile kernel name in it) is cut; findings.json has it whole


def clip(text: str, limit: int = LINE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_VERDICT = {"problem": "bold", "no_problem": "bold green", "inconclusive": "bold yellow", "nothing_ran": "bold red"}


def make_console(file=None, stderr: bool = False) -> Console:
    """A console that wraps on a terminal only (soft wrap: long lines are left whole in logs and pipes)."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(file=stream, highlight=False, soft_wrap=not tty)


def verdict_lines(v: dict) -> list[Text]:
    """The verdict as a few lines of text (shared by `analyze` and `check`)."""
    out = []
    kicker = {
        "problem": "Verdict",
        "no_problem": "Verdict (no problem found)",
        "inconclusive": "Verdict",
        "nothing_ran": "Verdict",
    }
    line = Text(f"{kicker.get(v['status'], 'Verdict')}: ", style=_VERDICT.get(v["status"], "bold"))
    line.append(Text(clip(v["headline"]), style="bold"))
    out.append(line)
    if v["status"] == "inconclusive" and v.get("next_check"):
        out.append(Text(f"  Re-capture: {clip(v['next_check'])}"))
    if v.get("rule"):
        meta = Text("  ")
        meta.append(v["rule"], style="bold")
        meta.append(" ")
        meta.append(v.get("severity") or "", style=_SEV.get(v.get("severity") or "", ""))
        meta.append(f" · {v['cost']}" + (f" · confidence {v['confidence']}" if v.get("confidence") else ""))
        out.append(meta)
        if v.get("next_check"):
            out.append(Text(f"  Next check: {clip(v['next_check'])}"))
    if v.get("second"):
        e = v["second"]
        out.append(Text(f"  Then, what would raise capacity: {e['rule']} {e['cost']}: {clip(e['title'])}"))
    for c in v.get("caveats", []):
        q = f" (qualifies {', '.join(c['qualifies'])})" if c.get("qualifies") else ""
        out.append(Text(f"  Caveat: {c['rule']}: {clip(c['title'])}{q}"))
    if v.get("explains"):
        out.append(Text(f"  May explain: {', '.join(v['explains'])} (folded under it)"))
    for a in v.get("also", []):
        also = Text("  Also: ")
        also.append(a["rule"], style="bold")
        also.append(" ")
        also.append(a["severity"] or "", style=_SEV.get(a["severity"] or "", ""))
        also.append(f" {a['cost']}: {clip(a['title'])}")
        out.append(also)
    if v.get("undetermined") and v["status"] != "inconclusive":
        for u in v["undetermined"]:
            out.append(Text(f"  Not decided: {u['rule']}: {clip(u['decide'])}"))
    if v.get("largest_effect"):
        e = v["largest_effect"]
        out.append(Text(f"  Largest measured effect (info, not a fault): {e['rule']} {e['cost']}: {clip(e['title'])}"))
    out.append(Text(f"Coverage: {v['coverage_text']}", style="dim" if v["coverage"]["ran"] else "bold red"))
    return out


def _finding_line(c: dict, indent: str) -> Text:
    sev = c.get("severity") or ""
    t = Text(indent)
    t.append(f"{c['rule']:<8}", style="bold")
    t.append(f"{sev:<8}", style=_SEV.get(sev, ""))
    t.append(f"{percent(c['impact']) if c.get('impact') is not None else '—':>6}  ")
    t.append(clip(c["title"]))
    return t


def print_summary(report, out_dir, console: Console | None = None) -> None:
    console = console or make_console()
    d = report.to_dict()
    ranks = sorted({r for i in d["inputs"] for r in i["ranks"]})
    tp = d["tp"]
    head = f"tracediag: {len(d['inputs'])} input(s), ranks {ranks}, p = {tp['p'] if tp else '?'}"
    console.print(Text(head + (f" ({tp['source']})" if tp else ""), style="bold"))
    for line in verdict_lines(d["verdict"]):
        console.print(line)
    if d.get("fitness"):
        f = d["fitness"]
        console.print(Text(f"Window: {clip(f['why'])}", style="dim" if f["fit"] else "bold magenta"))
        if f.get("domain"):
            console.print(Text(f"Workload: {clip(f['domain']['label'])}", style="dim"))
        if f.get("graph_replay"):
            console.print(Text(f"Graph replay: {clip(f['graph_replay']['why'])}", style="dim"))
        if f.get("host_side"):
            console.print(Text(f"Host side: {clip(f['host_side']['why'])}", style="dim"))
    folded = fold([c for c in d["checks"] if c["status"] == "finding"])
    if folded:
        console.print(Text("Findings, ranked by impact (consequences indented under their cause):", style="bold"))
        for cause, consequences in folded:
            console.print(_finding_line(cause, "  "))
            for c in consequences:
                console.print(_finding_line(c, "    ↳ "))
    by_status = {s: [c["rule"] for c in d["checks"] if c["status"] == s] for s in ("pass", "not_applicable")}
    if by_status["pass"]:
        console.print(Text(f"pass: {' '.join(by_status['pass'])}", style="green"))
    if by_status["not_applicable"]:
        console.print(
            Text(f"could not run (reasons in the report): {' '.join(by_status['not_applicable'])}", style="dim")
        )
    if d["cost_model"]["applies"] is False:
        console.print(
            Text("The 2L·τ_AR(T·H·e_a) cost model does not apply to this run (see the findings).", style="yellow")
        )
    console.print(
        Text(f"report: {out_dir}/report.html  findings: {out_dir}/findings.json  store: {out_dir}/trace.duckdb")
    )
