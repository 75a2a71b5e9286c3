"""Start-up cost of the command line: `tracediag --help`, a whole `tracediag check` of a sample, and the processing of
check's options alone (typer's `make_context`, CPU time, and whether pydantic got imported), each in fresh
processes, the trees given interleaved round by round so a shared machine's load hits them alike.

    python benchmarks/bench_cli_startup.py --tree before=/tmp/main-copy --tree after=. --rounds 10

A tree is a folder holding a `tracediag/` package (a checkout, or `git archive COMMIT tracediag | tar -x -C DIR`); it
is put first on PYTHONPATH. Prints medians and minimums; benchmarks/README.md has the results.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "healthy_tp2"
CHECK = ["check", str(SAMPLE), "-m", str(SAMPLE / "config.json"), "-q"]
OPTIONS_ONLY = (
    "import sys, time, typer.main\n"
    "from tracediag.cli import app\n"
    "command = typer.main.get_command(app).commands['check']\n"
    "t = time.process_time()\n"
    "command.make_context('check', sys.argv[2:])\n"
    "print(time.process_time() - t, 'pydantic' in sys.modules)\n"
)


# every run starts in the same empty folder: no tracediag.toml or pyproject.toml above it differs between trees
WORK = Path(tempfile.mkdtemp(prefix="bench-cli-startup-"))


def _run(tree: Path, args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout) of `python ARGS` with `tree` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=WORK).stdout
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="LABEL=DIR")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    trees = {label: Path(path).resolve() for label, _, path in (t.partition("=") for t in a.tree)}
    cases = {"--help": ["-m", "tracediag", "--help"], "check of the sample": ["-m", "tracediag", *CHECK]}
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    options: dict[str, list[float]] = {label: [] for label in trees}
    pydantic: dict[str, str] = {}
    for _ in range(a.rounds):
        for case, args in cases.items():
            for label, tree in trees.items():
                w, c, _ = _run(tree, args)
                wall.setdefault((case, label), []).append(w)
                cpu.setdefault((case, label), []).append(c)
        for label, tree in trees.items():
            _, _, out = _run(tree, ["-c", OPTIONS_ONLY, *CHECK])
            seconds, imported = out.split()
            options[label].append(float(seconds))
            pydantic[label] = imported
    for (case, label), w in wall.items():
        c = cpu[(case, label)]
        print(f"{case:20} {label:12} wall median {statistics.median(w):.3f} s (min {min(w):.3f}); "
              f"CPU median {statistics.median(c):.3f} s (min {min(c):.3f})")  # fmt: skip
    for label, v in options.items():
        print(f"{'check options':20} {label:12} CPU median {statistics.median(v) * 1000:.1f} ms "
              f"(min {min(v) * 1000:.1f}); pydantic imported: {pydantic[label]}")  # fmt: skip
    print(f"rounds {a.rounds}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
