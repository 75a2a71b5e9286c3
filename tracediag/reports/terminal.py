"""Short terminal summary (rich), rendered from the same check dicts as the HTML and JSON.

Titles can quote kernel and annotation names, so they are passed as Text (never as markup).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

_STYLE = {"finding": "bold yellow", "pass": "green", "not_applicable": "dim"}
_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_summary(report, out_dir, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    d = report.to_dict()
    ranks = sorted({r for i in d["inputs"] for r in i["ranks"]})
    tp = d["tp"]
    head = f"tracediag: {len(d['inputs'])} input(s), ranks {ranks}, p = {tp['p'] if tp else '?'}"
    console.print(Text(head + (f" ({tp['source']})" if tp else ""), style="bold"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("rule", "status", "severity", "what"):
        table.add_column(col, overflow="fold")
    for c in d["checks"]:
        what = c["title"] if c["status"] != "not_applicable" else f"not applicable: {c['reason']}"
        sev = c.get("severity") or ""
        table.add_row(
            Text(c["rule"]),
            Text(c["status"], style=_STYLE[c["status"]]),
            Text(sev, style=_SEV.get(sev, "")),
            Text(what),
        )
    console.print(table)
    if d["cost_model"]["applies"] is False:
        console.print(
            Text("The 2L·τ_AR(T·H·e_a) cost model does not apply to this run (see the findings).", style="yellow")
        )
    console.print(
        Text(f"report: {out_dir}/report.html  findings: {out_dir}/findings.json  store: {out_dir}/trace.duckdb")
    )
