"""Renderers (HTML, terminal) and report sections; findings.json is `Report.to_dict()` (tracediag.output)."""
