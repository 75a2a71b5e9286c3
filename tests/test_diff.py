"""`tracediag diff BEFORE AFTER` on real pairs: sample traces (healthy vs a fault) and, when the Nsight
ingester is present, the 2×H100 nsys before/after exports from nsys-ai's fixtures."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import typer
from conftest import EXTERNAL, SAMPLES
from typer.testing import CliRunner

from tracediag.cli import check as check_cmd
from tracediag.cli import diff as diff_cmd

HEALTHY = SAMPLES / "healthy_tp2"
NSYS = EXTERNAL / "nsys"


def cli(*args):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _main() -> None:
        """tracediag (commands under test)."""

    check_cmd.register(app)
    diff_cmd.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("diff"))


@cache
def diffed(tmp: str, before: str, after: str, *extra: str) -> tuple[dict, str, Path]:
    out = Path(tmp) / f"{Path(before).name}__{Path(after).name}"
    r = cli("diff", before, after, "--out", out, *extra)
    assert r.exit_code == 0, r.stdout + r.stderr
    return json.loads((out / "diff.json").read_text()), r.stdout, out


def rows(d: dict, section: str, **match) -> list[dict]:
    return [r for r in d[section] if all(r.get(k) == v for k, v in match.items())]


def test_healthy_vs_fp32_comm(tmp_module):
    fault = SAMPLES / "fault_fp32_comm_tp2"
    d, text, out = diffed(tmp_module, str(HEALTHY), str(fault), "-m", str(HEALTHY / "config.json"))
    assert d["schema"] == "tracediag/diff-v1"
    assert [f["id"] for f in d["findings"]["added"]] == ["COL002"]
    # COL003 judged the healthy CPU run (TP=2 slower than TP=1 at decode); on the fault it is not applicable
    # because COL002 broke the cost model — so it leaves the findings list.
    assert {f["id"] for f in d["findings"]["removed"]} <= {"COL003"}
    (ar,) = rows(d, "payload_per_call", key="all_reduce")
    assert ar["before_mean_bytes"] == pytest.approx((9 * 24576 + 6 * 9 * 1024) / 63)
    assert ar["after_mean_bytes"] == pytest.approx((8 * 49152 + 24576 + 6 * (8 * 2048 + 1024)) / 63)
    assert ar["before_dtypes"] == ["bf16"] and ar["after_dtypes"] == ["bf16", "fp32"]
    (fp32,) = rows(d, "payload_by_dtype", key="all_reduce,fp32")
    assert (fp32["before_calls"], fp32["after_calls"]) == (0, 112)  # 8 layer all-reduces × 7 steps × 2 ranks
    (ag,) = rows(d, "payload_per_call", key="all_gather")
    assert ag["change"] == 0  # the logits all-gather is untouched
    for r in d["collectives_per_step"]:
        assert r["change"] == 0
    assert "finding added: COL002 (warning)" in text
    assert "all_reduce payload per call: 4,389 B → 8,290 B (+88.9%); dtypes bf16 → bf16, fp32" in text
    assert "all_reduce fp32 calls: 0 → 112" in text
    html = (out / "diff.html").read_text()
    assert "all_reduce payload per call" in html and "COL002" in html


def test_healthy_vs_extra_allreduce(tmp_module):
    fault = SAMPLES / "fault_extra_allreduce_tp2"
    d, text, _ = diffed(tmp_module, str(HEALTHY), str(fault), "-m", str(HEALTHY / "config.json"))
    assert [f["id"] for f in d["findings"]["added"]] == ["COL001"]
    for phase in ("prefill", "decode"):
        (r,) = rows(d, "collectives_per_step", phase=phase, op="all_reduce")
        assert (r["before"], r["after"], r["change"]) == (9, 13, 4)  # 2L + 1 → 3L + 1
        assert f"all_reduce calls per {phase} step: 9 → 13 (+4)" in text
    (ar,) = rows(d, "payload_by_dtype", key="all_reduce,bf16")
    assert (ar["before_calls"], ar["after_calls"]) == (126, 182)
    assert ar["change"] == pytest.approx(0, abs=0.05)  # the extra calls are [T, H] like the others


def test_diff_of_findings_json_and_output_folders(tmp_module):
    # sides given as analyze outputs (findings.json with trace.duckdb beside it), and a bare findings.json
    outs = {}
    for name in ("healthy_tp2", "kv_replicated_tp4"):
        out = Path(tmp_module) / f"out_{name}"
        r = cli("check", SAMPLES / name, "-m", SAMPLES / name / "config.json", "--out", out, "-q")
        assert r.exit_code in (0, 1)
        outs[name] = out
    # another model (H_kv) at another TP: not comparable; compared anyway here, to read what changed
    d, _, _ = diffed(tmp_module, str(outs["healthy_tp2"]), str(outs["kv_replicated_tp4"] / "findings.json"),
                     "--force-compare")  # fmt: skip
    assert d["comparability"]["verdict"].startswith("not comparable: model: H_kv 4 → 2 (config hash ")
    assert d["comparability"]["verdict"].endswith("; TP 2 → 4") and d["comparability"]["forced"]
    assert d["before"]["kind"] == "output" and d["after"]["kind"] == "findings"
    assert d["before"]["measures_source"] == d["after"]["measures_source"] == "store"
    assert [f["id"] for f in d["findings"]["added"]] == ["SHP001"]
    assert d["before"]["tp"]["p"] == 2 and d["after"]["tp"]["p"] == 4
    bare = Path(tmp_module) / "bare"
    bare.mkdir()
    (bare / "findings.json").write_bytes((outs["healthy_tp2"] / "findings.json").read_bytes())
    d, _, _ = diffed(tmp_module, str(bare / "findings.json"), str(outs["healthy_tp2"]))
    assert d["before"]["measures_source"].startswith("findings.json (no trace.duckdb beside it")
    assert not d["findings"]["added"] and not d["findings"]["removed"]
    assert all(r["change"] == 0 for r in d["step_time"])  # same run: the measures from JSON and store agree
    assert all(r["change"] == 0 for r in d["collectives_per_step"])
    assert not d["headlines"], d["headlines"]
    assert d["kernel_family_time"] == [] and "need the store" in d["notes"][0]


def test_html_escapes_untrusted_text(tmp_module, tmp_path):
    # A findings.json whose finding title carries markup (kernel names are untrusted): edited from a real
    # output, since no trace has such a name.
    d = SAMPLES / "fault_fp32_comm_tp2"
    out = tmp_path / "o"
    cli("check", d, "-m", d / "config.json", "--out", out, "-q")
    doc = json.loads((out / "findings.json").read_text())
    for c in doc["checks"]:
        if c["rule"] == "COL002":
            c["title"] = '<script>alert("x")</script> & <b>bold</b>'
    (out / "findings.json").write_text(json.dumps(doc))
    _, _, diff_out = diffed(tmp_module, str(HEALTHY / "config.json").replace("config.json", ""), str(out))
    html = (diff_out / "diff.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_bad_sides_exit_2(tmp_path):
    r = cli("diff", tmp_path / "nope", HEALTHY)
    assert r.exit_code == 2 and r.stderr.strip() == f"tracediag: error: {tmp_path / 'nope'}: no such file or directory"
    r = cli("diff", HEALTHY / "config.json", HEALTHY, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "unrecognised input" in r.stderr
    assert not (tmp_path / "o").exists()


def test_nsys_2xh100_before_after(tmp_module):
    d, text, out = diffed(
        tmp_module, str(NSYS / "nsysai_2xh100_before.sqlite"), str(NSYS / "nsysai_2xh100_after.sqlite")
    )
    assert d["before"]["measures_source"] == "store" and d["before"]["time_basis"] == "GPU kernels"
    fams = {(r["klass"], r["family"]): r for r in d["kernel_family_time"]}
    nccl = fams[("collective", "nccl")]
    attn = next(r for (k, _), r in fams.items() if k == "attention")
    for r in (nccl, attn):
        assert r["before_total_ns"] > 0 and r["after_total_ns"] > 0
        assert r["change"] == pytest.approx(r["after_total_ns"] / r["before_total_ns"] - 1)
    assert any(line.startswith("collective/nccl time in total: ") for line in d["headlines"])
    assert text.count("\n") >= 3  # names the changes, with numbers
    assert (out / "diff.html").read_text().count("<tr>") > 10
