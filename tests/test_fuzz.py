"""Mutation fuzzing of every input, seeded from the real files in the repository (tests/fuzz/).

Property: whatever the mutation, the target returns, or raises a TracediagError whose message is one line naming the
file — never another exception (the CLI's exit 3), never several lines. Through the CLI: exit 0, 1 or 2 only, exit 2
is one stderr line naming the file, and a failed run leaves nothing behind.

hypothesis draws the seed file and the mutation's random choices (and shrinks a failure to the smallest edit that
still fails). The budget is fixed and the examples are derandomized, so the normal suite runs the same inputs
every time in about a minute; more examples with `TRACEDIAG_FUZZ_EXAMPLES=N pytest tests/test_fuzz.py` (N per
test), and the long run with hang and partial-output accounting is `benchmarks/fuzz_long.py`
(benchmarks/README.md, results in benchmarks/results/fuzz_long_*.json).

Every kind the long run knows is in this budget (`KINDS_IN_SUITE`), with fewer examples for the slower ones.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from fuzz import harness, mutate, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCALE = int(os.environ.get("TRACEDIAG_FUZZ_EXAMPLES", "0"))


def budget(default: int, **extra) -> settings:
    return settings(
        **extra,
        max_examples=SCALE or default,
        derandomize=not SCALE,  # the normal suite: the same inputs every run
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )


# input kind -> (target, examples in the normal suite)
KINDS_IN_SUITE = {
    "kineto": ("ingest", 40),
    "nsys": ("ingest", 20),
    "nccl-tests": ("ingest", 60),
    "topology": ("ingest", 60),
    "vllm-log": ("ingest", 20),
    "sglang-log": ("ingest", 20),
    "prometheus": ("ingest", 15),
    "vllm-bench": ("ingest", 40),
    "sglang-bench": ("ingest", 40),
    "model": ("config", 80),
    "check-toml": ("config", 80),
}


def _case(kind: str, rnd: random.Random, work: Path) -> Path:
    return mutate.mutate(kind, rnd.choice(seeds.seed_files(kind)), work, rnd)


def _assert_contract(outcome: harness.Outcome, path: Path) -> None:
    assert not outcome.defect, f"{outcome.status}: {outcome.detail} at {outcome.where} (input kept at {path})"


def _property(kind: str, target: str):
    @budget(KINDS_IN_SUITE[kind][1])
    @given(rnd=st.randoms(use_true_random=False))
    def check(rnd: random.Random) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-"))
        path = _case(kind, rnd, work)
        outcome = harness.run_target(target, kind, path, seconds=120)
        if outcome.defect:
            _assert_contract(outcome, path)  # keeps the input for the report
        shutil.rmtree(work, ignore_errors=True)

    return check


@pytest.mark.parametrize("kind", list(KINDS_IN_SUITE))
def test_mutated_inputs_give_data_or_one_line_errors(kind):
    _property(kind, KINDS_IN_SUITE[kind][0])()


@pytest.mark.parametrize("kind", ["kineto", "nsys"])
def test_mutated_traces_survive_the_store_and_the_derivations(kind):
    """Values an ingester accepts must not overflow later (ts + dur, sums, elements × size in the derive SQL)."""

    @budget(8)
    @given(rnd=st.randoms(use_true_random=False))
    def check(rnd: random.Random) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-"))
        path = _case(kind, rnd, work)
        outcome = harness.run_target("analyze", kind, path, seconds=120)
        if outcome.defect:
            _assert_contract(outcome, path)
        shutil.rmtree(work, ignore_errors=True)

    check()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the CLI runs are forked")
@pytest.mark.parametrize("kind", ["kineto", "nsys", "nccl-tests", "topology", "check-toml"])
def test_cli_exit_contract_on_mutated_inputs(kind):
    """exit 0/1/2 only (never 3); exit 2 is one stderr line naming the file; no partial outputs."""

    @budget(2)
    @given(rnd=st.randoms(use_true_random=False))
    def check(rnd: random.Random) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-cli-{kind}-"))
        path = _case(kind, rnd, work)
        outcome = harness.check_cli(kind, path, work, seconds=180)
        if outcome.defect:
            _assert_contract(outcome, path)
        shutil.rmtree(work, ignore_errors=True)

    check()


# --- never-ending and oversized inputs --------------------------------------------------------------------------

ENDLESS_KINDS = [k for k in KINDS_IN_SUITE if k != "check-toml"]  # the check config is read by tracediag.gate


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("shape", mutate.ENDLESS_SHAPES)
@pytest.mark.parametrize("kind", ENDLESS_KINDS)
def test_never_ending_and_oversized_inputs_are_refused_in_bounded_time(tmp_path, kind, shape):
    """A named pipe, /dev/zero, a real file with a hole of GiBs after it, a gzip bomb of it: each reader returns
    or refuses the file in one line within the time limit (a named pipe blocked forever, /dev/zero and the holes
    were read whole before), every kind of input, from one of its real seed files."""
    rnd = random.Random(f"{kind}:{shape}")
    seed = rnd.choice(seeds.seed_files(kind))
    path = mutate.endless_or_oversized(seed, tmp_path / seed.name, rnd, shape)
    target = KINDS_IN_SUITE[kind][0]
    outcome = harness.run_target(target, kind, path, seconds=60)
    _assert_contract(outcome, path)
    if shape in ("fifo", "char-device"):
        assert outcome.status == "input_error" and "not a regular file" in outcome.detail, outcome


# --- the harness itself can fail --------------------------------------------------------------------------------


def test_the_harness_reports_an_internal_error(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    out = harness.classify(lambda: 1 / 0, f)
    assert out.status == "internal" and out.defect and "ZeroDivisionError" in out.detail


def test_the_harness_holds_errors_to_the_one_line_contract(tmp_path):
    from tracediag.errors import InputError

    f = tmp_path / "x.json"

    def two_lines():
        raise InputError(f, "first\nsecond")

    def unnamed():
        raise InputError("elsewhere.json", "bad")

    assert harness.classify(two_lines, f).status == "bad_error"
    assert harness.classify(unnamed, f).status == "bad_error"


def test_the_harness_catches_a_hang(tmp_path):
    import time

    out = harness.classify(lambda: time.sleep(5), tmp_path / "x", seconds=0.2)
    assert out.status == "hang"


def test_mutations_are_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for kind in seeds.KINDS:
        pa = mutate.mutate(kind, seeds.seed_files(kind)[0], a, random.Random(f"{kind}:1"))
        pb = mutate.mutate(kind, seeds.seed_files(kind)[0], b, random.Random(f"{kind}:1"))
        assert pa.read_bytes() == pb.read_bytes(), kind


# --- regressions of the check config (tracediag.toml), minimal inputs -------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b'fail_on = "warning"\nrules = "\xe8"\n', "not UTF-8"),  # UnicodeDecodeError escaped before
        (b"payload_tolerance = " + b"1" + b"0" * 400 + b"\n", "payload_tolerance"),  # OverflowError before
        (b"payload_tolerance = nan\n", "payload_tolerance"),  # was accepted: every comparison false
        (b"[tolerances]\nstep_time = inf\n", "tolerances.step_time"),
    ],
)
def test_check_config_values_beyond_a_float_are_one_line_errors(tmp_path, text, needle):
    from tracediag.errors import InputError
    from tracediag.gate.config import load_config

    f = tmp_path / "tracediag.toml"
    f.write_bytes(text)
    with pytest.raises(InputError, match=needle) as e:
        load_config(f, search=False)
    assert str(e.value).startswith(str(f)) and "\n" not in str(e.value)


# --- regressions found by the long run (benchmarks/fuzz_long.py), each a real file with one value edited ---------

EXTERNAL = seeds.EXTERNAL
PROM_617 = EXTERNAL / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom"
TOPOLOGY = seeds.TESTS / "data" / "topology" / "h100x2_nvswitch.topo.json"
MODEL = seeds.SAMPLES / "healthy_tp2" / "config.json"
CHECK_TOML = sorted((seeds.TESTS / "data").glob("check_*.toml"))[0]
DIGITS_5000 = "7" * 5000  # past Python's int_max_str_digits (4,300): int() raises ValueError, not a decode error


def _one_line_error(exc: BaseException, path: Path, needle: str) -> None:
    msg = str(exc)
    assert msg.startswith(str(path)) and "\n" not in msg and needle in msg, msg


def test_a_metric_value_beyond_a_double_is_one_malformed_sample(tmp_path):
    """`... 1000…0` (401 digits) in one bucket line: OverflowError in float() escaped the ingester before."""
    from tracediag.ingest.base import IngestOptions
    from tracediag.ingest.prometheus import parse_prometheus

    lines = PROM_617.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if "_bucket{" in ln)
    lines[i] = lines[i].rsplit(" ", 1)[0] + " 1" + "0" * 400
    f = tmp_path / "metrics.prom"
    f.write_text("\n".join(lines) + "\n")
    good = parse_prometheus(PROM_617, 0, IngestOptions())
    bad = parse_prometheus(f, 0, IngestOptions())
    meta = json.loads(bad.inputs_rows[0]["meta_json"])
    assert meta["malformed_lines"] == 1 and "64-bit float" in meta["malformed_examples"][0]["text"], meta
    assert bad.tables["metric_samples"].num_rows == good.tables["metric_samples"].num_rows - 1


@pytest.mark.parametrize("edit", ["deep", "digits"])
def test_json_configs_nested_too_deep_or_with_5000_digit_integers_are_one_line_errors(tmp_path, edit):
    """RecursionError (1,500 nested arrays) and ValueError (5,000 digits) escaped json.loads in the model config
    and the topology snapshot before."""
    from tracediag.errors import InputError
    from tracediag.ingest.base import IngestOptions
    from tracediag.ingest.topology import parse_topology
    from tracediag.model import load_model_config

    token = "[" * 1500 + "]" * 1500 if edit == "deep" else DIGITS_5000
    for seed, load in ((MODEL, load_model_config), (TOPOLOGY, lambda p: parse_topology(p, 0, IngestOptions()))):
        text = seed.read_text()
        key = '"hidden_size"' if seed is MODEL else '"total_bytes"'
        head, rest = text.split(key, 1)
        value_end = rest.index(",")
        f = tmp_path / seed.name
        f.write_text(head + key + ": " + token + rest[value_end:])
        with pytest.raises(InputError) as e:
            load(f)
        _one_line_error(e.value, f, "not valid JSON")


@pytest.mark.parametrize("token", [DIGITS_5000, "[" * 1500 + "]" * 1500])
def test_check_config_with_5000_digits_or_1500_nested_arrays_is_a_one_line_error(tmp_path, token):
    from tracediag.errors import InputError
    from tracediag.gate.config import load_config

    f = tmp_path / "tracediag.toml"
    f.write_text(CHECK_TOML.read_text() + f"\npayload_tolerance = {token}\n")
    with pytest.raises(InputError) as e:
        load_config(f, search=False)
    _one_line_error(e.value, f, "not valid TOML")


VLLM_BENCH = EXTERNAL / "vllm" / "bench"
SGLANG_STARTUP = (
    EXTERNAL / "sglang" / "log_excerpts" / "sglang-29575_startup_max_total_num_tokens_available_gpu_mem.log"
)
SGLANG_EAGLE = EXTERNAL / "sglang" / "log_excerpts" / "sglang-11948_eagle3_accept_len_accept_rate.log"
MIB = 1 << 20


def _parse(fmt: str, path: Path):
    from tracediag.ingest import parser_for
    from tracediag.ingest.base import IngestOptions

    return parser_for(fmt)(path, 0, IngestOptions())


def _bad_records(parsed) -> dict:
    return json.loads(parsed.inputs_rows[0]["meta_json"]).get("bad_records") or {}


@pytest.mark.parametrize(
    ("fmt", "seed", "grow"),
    [  # each took hours before (a regex restarting at every character of the run)
        ("sglang-log", SGLANG_STARTUP, lambda t: t.replace("max_total_num_tokens", "x" * MIB + "_tokens", 1)),
        ("sglang-log", SGLANG_EAGLE, lambda t: t.replace("#queue-req: 0, \n", "#queue-req: 0, " + " " * MIB + "\n", 1)),
        ("vllm-bench", VLLM_BENCH / "vllm-0.33.0_rateinf_stdout.log", lambda t: t.replace("=" * 12, "=" * MIB, 1)),
        ("prometheus", PROM_617, lambda t: "# tracediag-scrape seq=1 " + "x" * MIB + "\n" + t),
    ],
)
def test_a_line_grown_by_a_mib_of_one_character_parses_in_linear_time(tmp_path, fmt, seed, grow):
    f = tmp_path / seed.name
    f.write_text(grow(seed.read_text()))
    outcome = harness.run_target("ingest", fmt if fmt != "vllm-bench" else "vllm-bench", f, seconds=20)
    assert outcome.status in ("ok", "input_error"), outcome


def test_bench_counts_of_inf_and_text_that_is_not_utf8_are_counted_bad_values(tmp_path):
    """`Total generated tokens: inf` in the result table, and a backend of "\\ud800" in the JSON: ArrowInvalid and
    UnicodeEncodeError escaped the bench ingester before."""
    table = tmp_path / "stdout.log"
    table.write_text(
        re.sub(
            r"(Total generated tokens:\s+)\d+", r"\g<1>inf", (VLLM_BENCH / "vllm-0.33.0_rateinf_stdout.log").read_text()
        )
    )
    parsed = _parse("vllm-bench", table)
    assert parsed.tables["bench_runs"]["total_output_tokens"].to_pylist() == [None]
    assert _bad_records(parsed)["fields"]["bench_runs.total_output_tokens"]["count"] == 1
    doc = json.loads((VLLM_BENCH / "vllm-0.33.0_rate2_save-result.json").read_text())
    f = tmp_path / "result.json"
    f.write_text(json.dumps(doc | {"backend": "\ud800vllm"}))
    parsed = _parse("vllm-bench", f)
    assert parsed.tables["bench_runs"]["backend"].to_pylist() == ["\ufffdvllm"]
    assert parsed.inputs_rows[0]["bad_records"] == 1


def test_a_model_config_with_a_lone_surrogate_is_a_one_line_error_not_a_crash_in_findings_json(tmp_path):
    """`"architectures": ["\\ud800", ...]` is valid JSON but no text: findings.json failed after the whole analysis."""
    from tracediag.errors import InputError
    from tracediag.model import load_model_config

    doc = json.loads(MODEL.read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps(doc | {"architectures": ["\ud800", *doc.get("architectures", [])]}))
    with pytest.raises(InputError) as e:
        load_model_config(f)
    _one_line_error(e.value, f, "architectures[0] is not valid text")


def test_sglang_prefix_hits_on_lines_without_a_time_reach_sch006(tmp_path):
    """The only prefill line (the one with the cache hit) has its time edited to `-1e30:27:56`: SCH006 divided
    the last value by 100 and got None (arg_max over a NULL time)."""
    lines = SGLANG_EAGLE.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if "Prefill batch" in ln)
    lines[i] = re.sub(r"\d\d:(\d\d:\d\d)", r"-1e30:\1", lines[i], count=1)
    f = tmp_path / "server.log"
    f.write_text("\n".join(lines) + "\n")
    from tracediag.analysis import analyze

    (c,) = [c for c in analyze([], extra_inputs=[(f, "sglang-log")]).checks if c.rule == "SCH006"]
    assert c.status in ("pass", "finding"), (c.status, c.title)
