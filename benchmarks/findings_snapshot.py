"""Every check of every sample and vendored real input, as stable JSON: the before/after proof of a change
meant to change no finding.

    python benchmarks/findings_snapshot.py OUTDIR          # one JSON file per input
    diff -r BEFORE AFTER                                   # empty when nothing changed

Each file holds the whole findings.json document (inputs, layout, fitness, verdict, checks with their values and
evidence, report sections) but the tool's version, with floats to 9 significant digits and the checkout's path
removed, so two checkouts can be compared.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
EXTERNAL = REPO / "tests" / "data" / "external"


# serving telemetry by folder: the input kind each file is given as
SERVING = {"log_excerpts": "vllm-log", "metrics": "prometheus", "bench": "vllm-bench"}


def inputs() -> dict[str, tuple[list[Path], Path | None, list[tuple[Path, str]]]]:
    cases: dict[str, tuple[list[Path], Path | None, list[tuple[Path, str]]]] = {}
    for d in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        cfg = d / "config.json"
        cases[f"sample-{d.name}"] = ([d], cfg if cfg.exists() else None, [])
    kineto = sorted((EXTERNAL / "kineto").glob("*.json.gz")) + sorted(
        (EXTERNAL / "kineto" / "capture").glob("*.json.gz")
    )
    for f in kineto + sorted((EXTERNAL / "nsys").glob("*.sqlite")):
        cases[f"external-{f.name}"] = ([f], None, [])
    for engine in ("vllm", "sglang"):
        for folder, kind in SERVING.items():
            for f in sorted((EXTERNAL / engine / folder).glob("*")):
                if kind == "vllm-bench" and f.suffix not in (".json", ".jsonl"):
                    continue
                cases[f"{engine}-{folder}-{f.name}"] = ([], None, [(f, kind)])
    return cases


def _normal(v):
    if isinstance(v, float):
        return float(f"{v:.9g}") if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {k: _normal(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_normal(x) for x in v]
    if isinstance(v, str):
        return v.replace(str(REPO) + "/", "")
    return v


def snapshot(out: Path) -> None:
    from tracediag.analysis import analyze
    from tracediag.errors import TracediagError

    out.mkdir(parents=True, exist_ok=True)
    for name, (paths, model, extra) in inputs().items():
        try:
            doc = analyze(paths, model=model, extra_inputs=extra).to_dict()
            doc.pop("tool")  # the version: the one field two checkouts may differ in by design
        except TracediagError as exc:
            doc = {"error": str(exc)}
        (out / f"{name}.json").write_text(json.dumps(_normal(doc), indent=1, sort_keys=True, ensure_ascii=False))
        print(name, file=sys.stderr)


if __name__ == "__main__":
    snapshot(Path(sys.argv[1]))
