"""The text `tracediag check` prints for a judged run (also the MCP check tool's text): the judged items, the
verdict, the coverage and a last line that never says PASSED without saying how many selected rules ran."""

from __future__ import annotations

import sys

_MARK = {"fail": "FAIL", "finding": "note", "pass": "pass", "skipped": "skip"}


def print_result(
    result, *, quiet: bool = False, junit=None, annotated_trace=None, out=None, file=None, audience: str = "cli"
) -> None:
    """The judged items, the verdict and the coverage, then one last line that never says PASSED without
    saying how many of the selected rules ran; inputs named as `audience` passes them (tracediag.inputspec)."""
    from tracediag.findings import coverage_sentence, verdict
    from tracediag.inputspec import advice
    from tracediag.reports.terminal import clip

    file = file or sys.stdout
    c = {s: [o for o in result.outcomes if o.status == s] for s in ("fail", "finding", "pass", "skipped")}
    cov = result.coverage
    if not quiet:
        base = f", baseline {result.baseline.label}" if result.baseline else ""
        cfg = f", config {result.config.path}" if result.config.path else ""
        req = f", {len(result.required)} required" if result.required else ""
        print(
            f"tracediag check: {len(result.rules_selected)} rule(s){req}, fail on {result.fail_on}{base}{cfg}",
            file=file,
        )
        for o in result.outcomes:
            if o.suite == "baseline" and o.status in ("pass", "skipped"):
                continue  # many measures: only regressions are listed; counts below
            vs = f" [{o.vs_baseline}]" if o.vs_baseline and o.status in ("fail", "finding") else ""
            sev = f" {o.severity}" if o.severity and o.status in ("fail", "finding") else ""
            print(f"  {_MARK[o.status]:<5} {o.id}{sev}{vs}: {clip(o.message)}", file=file)
        measured = [o for o in result.outcomes if o.suite == "baseline"]
        if result.baseline_not_comparable:
            print(
                f"  baseline: not compared, {clip(result.baseline_not_comparable)}; every finding is judged as new "
                "(tracediag diff shows the differences)",
                file=file,
            )
        if measured:
            ok = sum(1 for o in measured if o.status == "pass")
            print(f"  baseline: {ok} of {len(measured)} key measures within tolerance", file=file)
        v = result.doc.get("verdict") or verdict(result.doc["checks"], fitness=result.doc.get("fitness"))
        tail = f" ({v['rule']} {v['severity']}, {v['cost']})" if v.get("rule") else ""
        print(f"Verdict: {clip(v['headline'])}{tail}", file=file)
        print(f"Coverage: {coverage_sentence(cov, audience=audience)}", file=file)
        for label, path in (("junit", junit), ("annotated trace", annotated_trace), ("outputs", out)):
            if path is not None:
                print(f"  {label}: {path}", file=file)
    ran = f"{cov['ran']} of {cov['rules']} rules ran"
    if cov["could_not_run"]:
        ran += f"; {cov['could_not_run']} could not run"
        if cov["enable"]:
            first = cov["enable"][0]
            ran += f" (pass {advice(first['input'], audience)} to enable {len(first['rules'])} of them)"
    if result.passed:
        known = len(c["finding"])
        tail = f"; {known} finding(s) known or below {result.fail_on}" if known else ""
        print(f"PASSED: nothing new at or above {result.fail_on} — {ran}{tail}", file=file)
    else:
        parts = []
        found = c["fail"]
        if found:
            parts.append(f"{len(found)} new at or above {result.fail_on}: {', '.join(o.id for o in found)}")
        blocked = result.not_run_required
        if blocked:
            parts.append(f"{len(blocked)} required rule(s) could not run: {', '.join(o.id for o in blocked)}")
        if result.undiagnosable:
            parts.append(f"the run cannot be diagnosed: {clip(result.undiagnosable)}")
        if result.baseline_not_comparable:
            parts.append(f"the baseline cannot be compared with this run ({clip(result.baseline_not_comparable)})")
        print(f"{result.outcome.upper()}: {'; '.join(parts)} — {ran}", file=file)
