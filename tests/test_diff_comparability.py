"""`tracediag diff` fingerprints both runs and refuses to report regressions between runs that are not
comparable — another model, another load — unless --force-compare; diff.json carries both fingerprints and the
verdict. Real inputs: sample traces made with different config.json files, and `vllm bench serve` results at
different request rates and concurrency caps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from conftest import EXTERNAL, SAMPLES
from typer.testing import CliRunner

from tracediag.cli import diff as diff_cmd

HEALTHY = SAMPLES / "healthy_tp2"
WIDE = SAMPLES / "wide_tp2"
FP32 = SAMPLES / "fault_fp32_comm_tp2"
BENCH = EXTERNAL / "vllm" / "bench"


def cli(*args):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _main() -> None:
        """tracediag (commands under test)."""

    diff_cmd.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


def diffed(out: Path, *args) -> tuple[dict, str]:
    r = cli("diff", *args, "--out", out, "-j", "1")
    d = json.loads((out / "diff.json").read_text())
    assert r.exit_code == (0 if d["comparability"]["comparable"] else 1), r.stdout + r.stderr
    return d, r.stdout


def invalidating(d: dict) -> list[str]:
    return [x["what"] for x in d["comparability"]["differences"] if x["invalidates"]]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_two_models_are_not_comparable(models):
    args = (HEALTHY, WIDE, "--before-model", HEALTHY / "config.json", "--after-model", WIDE / "config.json")
    d, text = diffed(models / "plain", *args)
    comp = d["comparability"]
    assert comp["comparable"] is False and comp["forced"] is False
    (model,) = [x for x in invalidating(d) if x.startswith("model: ")]
    # the key dimensions that differ, as the two config.json files give them
    assert "L 4 → 2" in model and "H 256 → 4096" in model and "I 704 → 11008" in model and "H_kv 4 → 8" in model
    assert comp["verdict"].startswith("not comparable: model: ")
    # wide_tp2 also runs 8 sequences instead of 2: its steps have 4x the tokens
    assert "median T of decode steps 2 → 8" in invalidating(d)
    fb, fa = d["fingerprints"]["before"], d["fingerprints"]["after"]
    assert fb["model"]["config_hash"] != fa["model"]["config_hash"]
    assert (fb["model"]["H"], fa["model"]["H"]) == (256, 4096)
    assert fb["layout"]["tp"] == fa["layout"]["tp"] == 2  # the same layout is not listed as a difference
    assert not [x for x in comp["differences"] if x["aspect"] == "layout"]
    # no regression is reported: the comparison sections are empty and the terminal says why
    assert d["headlines"] == [] and d["step_time"] == [] and d["findings"]["added"] == []
    assert f"  {comp['verdict']}" in text and "pass --force-compare to compare anyway" in text
    html = (models / "plain" / "diff.html").read_text()
    assert "not comparable: model: L 4 → 2" in html and "What changed" not in html


def test_force_compare_reports_the_changes_and_keeps_the_verdict(models):
    args = (HEALTHY, WIDE, "--before-model", HEALTHY / "config.json", "--after-model", WIDE / "config.json")
    d, _ = diffed(models / "forced", *args, "--force-compare")
    comp = d["comparability"]
    assert comp["comparable"] is False and comp["forced"] is True
    assert d["headlines"][0] == f"compared anyway (--force-compare), although {comp['verdict']}"
    # the numbers are there again (other T buckets: wide_tp2 runs 8 sequences), with their headlines
    assert {r["T_bucket"] for r in d["step_time"]} >= {"T=2", "T=5-8"}
    assert any(r["change"] for r in d["communication_share"]) and len(d["headlines"]) > 1
    assert "What changed" in (models / "forced" / "diff.html").read_text()


def test_the_same_set_up_is_comparable(tmp_path):
    d, text = diffed(tmp_path / "o", HEALTHY, FP32, "-m", HEALTHY / "config.json")
    comp = d["comparability"]
    assert comp["comparable"] and comp["verdict"] == "comparable" and comp["differences"] == []
    fb, fa = d["fingerprints"]["before"], d["fingerprints"]["after"]
    assert fb["model"] == fa["model"] and fb["step_shapes"] == fa["step_shapes"]
    assert fb["engine"] == {"name": "vLLM", "version": None, "source": "step markers (vllm step annotation)"}
    assert fb["step_shapes"]["phase_mix"] == {"decode": pytest.approx(12 / 14), "prefill": pytest.approx(2 / 14)}
    assert "GPU: not known for either run (no device name in the inputs)" in comp["not_checked"]
    assert [f["id"] for f in d["findings"]["added"]] == ["COL002"]  # the regression is reported
    assert comp["checked"] == 5
    assert [a["label"] for a in comp["aspects"] if a["status"] == "not checked"] == ["GPU", "serving load"]
    assert text.splitlines()[1] == (
        "  comparable on 5 of 7 aspects; not checked: GPU (not known for either run: no device name in the inputs), "
        "serving load (not known for either run: no benchmark result or engine stats lines)"
    )


@pytest.mark.parametrize(
    ("before", "after", "difference"),
    [
        ("vllm-0.33.0_rate2_save-result.json", "vllm-0.33.0_rate6_save-detailed.json", "request rate (req/s) 2 → 6"),
        ("vllm-0.33.0_rate2_save-result.json", "vllm-0.33.0_rateinf_save-result.json", "request rate (req/s) 2 → inf"),
        ("vllm-0.33.0_rateinf_save-result.json", "vllm-0.33.0_cap4_save-detailed.json", "max concurrency no cap → 4"),
    ],
)
def test_two_loads_are_not_comparable(tmp_path, before, after, difference):
    d, text = diffed(tmp_path / "o", BENCH / before, BENCH / after)
    assert invalidating(d) == [difference]
    assert d["comparability"]["verdict"] == f"not comparable: {difference}"
    assert f"not comparable: {difference}" in text
    (rb,), (ra,) = (d["fingerprints"][s]["workload"]["runs"] for s in ("before", "after"))
    # prompt and output lengths from the results' token totals: the same on both sides, so not listed
    assert rb["mean_input_len"] == ra["mean_input_len"] == 64 and rb["mean_output_len"] == ra["mean_output_len"] == 16
    assert d["findings"]["added"] == [] and d["headlines"] == []


def test_a_different_number_of_requests_alone_does_not_invalidate(tmp_path):
    # the same rate (inf) with 40 requests on both sides, one capped: only the cap invalidates; a diff of the
    # uncapped run with itself has nothing to say
    d, _ = diffed(tmp_path / "same", BENCH / "vllm-0.33.0_rateinf_save-result.json",
                  BENCH / "vllm-0.33.0_rateinf_save-result.json")  # fmt: skip
    assert d["comparability"]["comparable"] and d["comparability"]["differences"] == []
    d, _ = diffed(tmp_path / "n", BENCH / "vllm-0.33.0_rate2_save-result.json",
                  BENCH / "vllm-0.33.0_rateinf_save-result.json", "--force-compare")  # fmt: skip
    stated = [x for x in d["comparability"]["differences"] if not x["invalidates"]]
    assert [x["what"] for x in stated] == ["requests 60 → 40"]
    assert "runs differ (does not invalidate the comparison): requests 60 → 40" in d["headlines"]


def test_the_fitness_aspect_reads_what_findings_json_writes(tmp_path):
    """findings.json writes fitness.class and fitness.why; the fingerprint read status/reason, so the aspect was
    always empty (diff.html: `None | None | same`) and a sampled rank was "unfit (None)"."""
    d, _ = diffed(tmp_path / "same", HEALTHY, FP32, "-m", HEALTHY / "config.json")
    why = "a CPU trace: no GPU activity and no GPU backend (ranks 0, 1 of 2)"
    assert d["fingerprints"]["before"]["fitness"] == {"status": "cpu_only", "fit": True, "reason": why}
    sampled = EXTERNAL / "kineto" / "hta_sampled_rank-1.json.gz"
    r = cli("diff", sampled, sampled, "--out", tmp_path / "sampled", "-j", "1")
    d = json.loads((tmp_path / "sampled" / "diff.json").read_text())
    assert not d["comparability"]["comparable"], r.stdout
    assert any(w.startswith("BEFORE trace is unfit for diagnosis (sampled): sampled: the CPU ops' external ids")
               for w in invalidating(d))  # fmt: skip


def test_serving_inputs_per_side_and_the_memory_limit(tmp_path):
    """--before-bench / --after-bench are read with each side's traces (as analyze --bench): the same traces
    under two loads are not comparable, exit 1; given for an analysed run, or a bad --memory-limit, exit 2."""
    args = (HEALTHY, HEALTHY, "-m", HEALTHY / "config.json", "--memory-limit", "1GiB")
    bench = ("--before-bench", BENCH / "vllm-0.33.0_rate2_save-result.json",
             "--after-bench", BENCH / "vllm-0.33.0_rate6_save-detailed.json")  # fmt: skip
    d, text = diffed(tmp_path / "o", *args, *bench)
    assert invalidating(d) == ["request rate (req/s) 2 → 6"]
    (load,) = [a for a in d["comparability"]["aspects"] if a["aspect"] == "workload"]
    assert load == {"aspect": "workload", "label": "serving load", "status": "not comparable",
                    "why": "request rate (req/s) 2 → 6"}  # fmt: skip
    assert text.splitlines()[1] == (
        "  not comparable: request rate (req/s) 2 → 6 (6 of 7 aspects checked; not checked: GPU (not known for "
        "either run: no device name in the inputs))"
    )
    from tracediag.analysis import analyze
    from tracediag.output import findings_json

    analysed = tmp_path / "findings.json"
    analysed.write_bytes(findings_json(analyze([HEALTHY], model=HEALTHY / "config.json")))
    log = BENCH / "vllm-0.33.0_rateinf_stdout.log"
    r = cli("diff", analysed, HEALTHY, "--before-log", log, "--out", tmp_path / "refused")
    assert r.exit_code == 2 and r.stderr.strip() == (
        f"tracediag: error: {log}: BEFORE ({analysed}) is an analysed run, whose logs, scrapes and benchmark results "
        "were read when it was analysed; give them to `tracediag analyze`, or give the run's traces"
    )
    assert not (tmp_path / "refused").exists()
    r = cli("diff", HEALTHY, HEALTHY, "--memory-limit", "1zz", "--out", tmp_path / "bad")
    assert (
        r.exit_code == 2
        and r.stderr.strip() == "tracediag: error: --memory-limit: not a size: '1zz' (examples: 512MiB, 2GiB)"
    )
