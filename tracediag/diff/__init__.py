"""`tracediag diff` as a library: load (or analyse) two runs and say what changed, as diff.json and diff.html.

`fingerprint.py` reads what each run ran and served (model, layout, GPU, engine, step shapes, workload,
fitness), `comparability.py` judges whether the two can be compared, `compare.py` computes the differences
(step time, shares, kernel families, collectives, payloads, dispatch, findings) and the headlines;
`render.py` writes them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tracediag.diff.compare import diff_runs
from tracediag.diff.render import write_diff
from tracediag.errors import UsageError
from tracediag.request import Request
from tracediag.runs import load_run, read_back

DIFF_OUTPUT_NAMES = ("diff.json", "diff.html")  # what `diff -o DIR` writes into DIR


def run_diff(
    before: Path,
    after: Path,
    *,
    before_model: Path | None = None,
    after_model: Path | None = None,
    tp: int | None = None,
    out: Path | None = None,
    keep_python: bool = False,
    jobs: int | None = None,
    force_compare: bool = False,
    memory_limit: int | str | None = None,
    before_inputs: list[tuple[Path, str]] = (),
    after_inputs: list[tuple[Path, str]] = (),
    config: Path | bool = False,
    naming: str = "python",
) -> dict:
    """Load (or analyse) both sides, diff them, write diff.json and diff.html into `out` when given.

    `before_inputs` / `after_inputs` are (path, format) serving inputs (CLI --before-log, ...) analysed with a side
    given as traces, within `memory_limit` (bytes or '2GiB', tracediag.memory), with the settings of `config` (a
    tracediag.toml; True: found from the working folder up, as the commands do). The inputs are checked as every
    entry point checks them (tracediag.request; `naming` "cli" names them by flag). Runs that cannot be compared
    (diff.comparability) get their fingerprints and the reasons, and no changes, unless `force_compare`."""
    if out is not None and Path(out).is_file():
        raise UsageError(f"--out {out} is a file; give a folder")

    def request(model: Path | None) -> Request:
        return Request.build(model=model, tp=tp, keep_python=keep_python or None, jobs=jobs,
                             memory_limit=memory_limit, config=config, naming=naming)  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="tracediag-diff-") as tmp:
        runs = [
            load_run(p, Path(tmp) / name, request=request(m), extra_inputs=x, side=name.upper())
            for p, m, x, name in (
                (before, before_model, before_inputs, "before"),
                (after, after_model, after_inputs, "after"),
            )
        ]
        with read_back(*runs):
            d = diff_runs(*runs, force_compare=force_compare)
    if out is not None:
        try:
            write_diff(d, Path(out))
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    return d
