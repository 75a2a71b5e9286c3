"""Short terminal summary (rich), rendered from the same check dicts as the HTML and JSON.

Findings in full (ranked), passes by id, not-applicable rules by id with a pointer to the report for
their reasons. Titles can quote kernel and annotation names, so they are passed as Text (never markup).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_summary(report, out_dir, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    d = report.to_dict()
    ranks = sorted({r for i in d["inputs"] for r in i["ranks"]})
    tp = d["tp"]
    head = f"tracediag: {len(d['inputs'])} input(s), ranks {ranks}, p = {tp['p'] if tp else '?'}"
    console.print(Text(head + (f" ({tp['source']})" if tp else ""), style="bold"))
    if d["findings"]:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, title_justify="left")
        for col in ("rule", "severity", "finding (ranked: walk step, severity, impact)"):
            table.add_column(col, overflow="fold")
        for c in d["findings"]:
            sev = c.get("severity") or ""
            table.add_row(Text(c["rule"]), Text(sev, style=_SEV.get(sev, "")), Text(c["title"]))
        console.print(table)
    else:
        console.print(Text("no findings", style="green"))
    by_status = {s: [c["rule"] for c in d["checks"] if c["status"] == s] for s in ("pass", "not_applicable")}
    if by_status["pass"]:
        console.print(Text(f"pass: {' '.join(by_status['pass'])}", style="green"))
    if by_status["not_applicable"]:
        console.print(
            Text(
                f"not applicable (inputs missing; reasons in the report): {' '.join(by_status['not_applicable'])}",
                style="dim",
            )
        )
    if d["cost_model"]["applies"] is False:
        console.print(
            Text("The 2L·τ_AR(T·H·e_a) cost model does not apply to this run (see the findings).", style="yellow")
        )
    console.print(
        Text(f"report: {out_dir}/report.html  findings: {out_dir}/findings.json  store: {out_dir}/trace.duckdb")
    )
