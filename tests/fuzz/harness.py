"""Run one (mutated) input through its target and say what happened.

Outcomes:
- `ok`: the target returned.
- `input_error`: a TracediagError whose message is one line and names the file (the contract).
- `bad_error`: a TracediagError that breaks the contract (several lines, or the file not named).
- `internal`: any other exception (a bug: the CLI would exit 3).
- `hang`: the target ran past its time limit (only where a limit is enforced).
- `partial`: (CLI) a failed run left files behind, or a successful one did not write all its outputs.

Targets (`TARGETS`): the ingester of each input kind alone (`ingest`), followed by loading into the store and
the derivations (`store`), or the whole analysis (`analyze`: derive + every rule + sections + findings.json),
the model config and the check config (`config`), and the CLI's exit contract (`cli`, in a forked process).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

from tracediag.errors import TracediagError

SAMPLE_TRACE = Path(__file__).resolve().parents[2] / "sample_traces" / "healthy_tp2"
# the ingest format of each fuzz kind
FORMAT = {"kineto": "kineto", "nsys": "nsys-sqlite", "nccl-tests": "nccl-tests", "topology": "topology",
          "vllm-log": "vllm-log", "sglang-log": "sglang-log", "prometheus": "prometheus", "vllm-bench": "vllm-bench",
          "sglang-bench": "sglang-bench"}  # fmt: skip
TRACE_KINDS = ("kineto", "nsys")
# --flag of each telemetry kind on the command line
FLAG = {"nccl-tests": "--nccl-tests", "topology": "--topology", "vllm-log": "--log", "sglang-log": "--log",
        "prometheus": "--metrics", "vllm-bench": "--bench", "sglang-bench": "--bench"}  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    status: str  # ok | input_error | bad_error | internal | hang | partial
    detail: str = ""  # exception type and message (first 300 characters), or what broke the contract
    where: str = ""  # innermost tracediag frame of an internal error ("tracediag/ingest/kineto/meta.py:23 in _meta")

    @property
    def defect(self) -> bool:
        return self.status in ("bad_error", "internal", "hang", "partial")

    @property
    def signature(self) -> str:
        """Groups outcomes of the same defect: status, exception type, where."""
        return f"{self.status}: {self.detail.split(':', 1)[0]} at {self.where}" if self.defect else self.status


class Timeout(BaseException):
    """Raised by the alarm of `time_limit` (a BaseException, so `except Exception` in the code under test
    cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise Timeout after `seconds` of wall time (main thread, POSIX); no limit when None."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/tracediag/" in f.filename.replace("\\", "/")]
    if not frames:
        return "outside tracediag"
    f = frames[-1]
    return f"tracediag/{f.filename.replace(os.sep, '/').split('/tracediag/', 1)[1]}:{f.lineno} in {f.name}"


def classify(fn, path: Path, seconds: float | None = None) -> Outcome:
    """Run `fn()` and classify what it did; `path` is the file an input error must name."""
    try:
        with time_limit(seconds):
            fn()
    except Timeout:
        return Outcome("hang", f"still running after {seconds} s")
    except TracediagError as exc:
        msg = str(exc)
        if "\n" in msg.strip():
            return Outcome("bad_error", f"message on several lines: {msg[:300]!r}")
        if str(path) not in msg and path.name not in msg:
            return Outcome("bad_error", f"message does not name {path.name}: {msg[:300]!r}")
        return Outcome("input_error", msg[:300])
    except RecursionError as exc:
        return Outcome("internal", f"RecursionError: {str(exc)[:200]}", _where(exc))
    except Exception as exc:  # the defects this suite exists to find
        return Outcome("internal", f"{type(exc).__name__}: {str(exc)[:300]}", _where(exc))
    return Outcome("ok")


# --- targets -----------------------------------------------------------------------------------------------


def ingest(kind: str, path: Path) -> None:
    from tracediag.ingest import parser_for
    from tracediag.ingest.base import IngestOptions

    parser_for(FORMAT[kind])(path, 0, IngestOptions())


def store(kind: str, path: Path) -> None:
    """Ingest, load into an in-memory store, run the derivations (where overflowing values would surface)."""
    from tracediag.ingest import parser_for
    from tracediag.ingest.base import IngestOptions
    from tracediag.pipeline import store_from

    parsed = parser_for(FORMAT[kind])(path, 0, IngestOptions())
    store_from([parsed]).close()


def analyze(kind: str, path: Path) -> None:
    """The whole analysis in memory, and the findings.json document serialised (as the CLI writes it)."""
    from tracediag.analysis import analyze as run
    from tracediag.output import findings_json

    if kind in TRACE_KINDS:
        report = run([path])
    elif kind == "model":
        report = run([SAMPLE_TRACE], model=path)
    else:
        report = run([], extra_inputs=[(path, FORMAT[kind])])
    findings_json(report)


def config(kind: str, path: Path) -> None:
    if kind == "model":
        from tracediag.model import load_model_config

        load_model_config(path)
    elif kind == "check-toml":
        from tracediag.gate.config import load_config

        load_config(path, search=False)
    else:
        raise ValueError(kind)


TARGETS = {"ingest": ingest, "store": store, "analyze": analyze, "config": config}


def run_target(target: str, kind: str, path: Path, seconds: float | None = None) -> Outcome:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return classify(lambda: TARGETS[target](kind, path), path, seconds)


# --- the CLI's exit contract ---------------------------------------------------------------------------------


def cli_args(kind: str, path: Path, out: Path) -> list[str]:
    """The command line that feeds one input of `kind` to `tracediag analyze` (or `check` for a TOML config)."""
    if kind in TRACE_KINDS:
        return ["analyze", str(path), "-o", str(out), "-q"]
    if kind == "model":
        return ["analyze", str(SAMPLE_TRACE), "-m", str(path), "-o", str(out), "-q"]
    if kind == "check-toml":
        return ["check", str(SAMPLE_TRACE), "-m", str(SAMPLE_TRACE / "config.json"), "--config", str(path),
                "--out", str(out)]  # fmt: skip
    return ["analyze", FLAG[kind], str(path), "-o", str(out), "-q"]


def run_cli(args: list[str], seconds: float) -> tuple[int | None, str]:
    """`tracediag ARGS` in a forked child (modules already imported: no interpreter start-up per input).
    Returns (exit status or None on timeout, stderr)."""
    import select
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 70
        try:
            os.close(r)
            os.dup2(w, 2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            import sys

            # fresh streams on fds 1 and 2 (under pytest, sys.stderr is a capture object, not fd 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            sys.argv = ["tracediag", *args]
            from tracediag.cli import main

            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stderr.flush()
        except BaseException:
            traceback.print_exc()
            code = 71
        finally:
            os._exit(code)
    os.close(w)
    err = bytearray()
    deadline = time.monotonic() + seconds
    status = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        ready, _, _ = select.select([r], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(r, 65536)
            if chunk:
                err += chunk
                continue
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            while chunk := os.read(r, 65536):
                err += chunk
            status = os.waitstatus_to_exitcode(st)
            break
    os.close(r)
    return status, err.decode("utf-8", "replace")


def check_cli(kind: str, path: Path, work: Path, seconds: float = 60.0) -> Outcome:
    """The exit contract: 0/1/2 only (and 4, inconclusive, for `check`); exit 2 is one stderr line naming a file;
    nothing partial left in `work` (the folder that holds the input and --out) after a failure, all three outputs
    after success."""
    out = work / "out"
    before = {p.name for p in work.iterdir()}
    args = cli_args(kind, path, out)
    status, err = run_cli(args, seconds)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if status is None:
        return Outcome("hang", f"tracediag {' '.join(args[:1])} still running after {seconds} s")
    if status not in ((0, 1, 2, 4) if kind == "check-toml" else (0, 1, 2)):
        return Outcome("internal", f"exit {status}: {' | '.join(lines)[-300:]}", "cli")
    left = sorted({p.name for p in work.iterdir()} - before)
    if status == 2:
        if len(lines) != 1:
            return Outcome("bad_error", f"exit 2 with {len(lines)} stderr lines: {' | '.join(lines)[:300]}")
        if path.name not in lines[0] and str(path) not in lines[0] and "--" not in lines[0]:
            return Outcome("bad_error", f"exit 2 without naming the file: {lines[0][:300]}")
        if left:
            return Outcome("partial", f"exit 2 left {left}")
        return Outcome("input_error", lines[0][:300])
    if kind != "check-toml" and sorted(p.name for p in out.iterdir()) != ["findings.json", "report.html",
                                                                         "trace.duckdb"]:  # fmt: skip
        return Outcome("partial", f"exit {status} but --out holds {sorted(p.name for p in out.iterdir())}")
    extra = [n for n in left if n != "out"]
    if extra:
        return Outcome("partial", f"exit {status} left {extra} beside --out")
    return Outcome("ok")
