"""`tracediag diff BEFORE AFTER` on real pairs: sample traces (healthy vs a fault) and, when the Nsight
ingester is present, the 2×H100 nsys before/after exports from nsys-ai's fixtures."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import typer
from conftest import EXTERNAL, SAMPLES, kineto_file
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
    d = json.loads((out / "diff.json").read_text())
    # exit 0 when comparable, 1 when not (forced or not), as `git diff --exit-code` says they differ
    assert r.exit_code == (0 if d["comparability"]["comparable"] else 1), r.stdout + r.stderr
    return d, r.stdout, out


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
    # comparable, and on what: 2 of 7 aspects (the exports name no GPU, no model was given, no step markers)
    comp = d["comparability"]
    assert comp["comparable"] and comp["checked"] == 2
    assert {a["aspect"]: a["status"] for a in comp["aspects"]} == {
        "model": "not checked", "layout": "same", "gpu": "not checked", "engine": "not checked",
        "step_shapes": "not checked", "workload": "not checked", "fitness": "same"}  # fmt: skip
    assert text.splitlines()[1] == (
        "  comparable on 2 of 7 aspects; not checked: model (not known for either run: no --model config.json), "
        "GPU (not known for either run: no device name in the inputs), engine (not known for either run: no engine "
        "step markers, log or startup facts), step shapes (not known for either run: no step markers), serving load "
        "(not known for either run: no benchmark result or engine stats lines)"
    )
    fams = {(r["klass"], r["family"]): r for r in d["kernel_family_time"]}
    # no step markers and other call counts: compared per call; the totals follow the 68 → 60 calls captured
    fa2, nccl = fams[("attention", "fa2")], fams[("collective", "nccl")]
    assert (fa2["before_calls"], fa2["after_calls"]) == (68, 60) and fa2["change_basis"] == "mean_ns"
    assert fa2["change"] == pytest.approx(fa2["after_mean_ns"] / fa2["before_mean_ns"] - 1)
    assert fa2["change"] == pytest.approx(0.002, abs=0.001) and fa2["total_change"] == pytest.approx(-0.116, abs=1e-3)
    assert (
        "attention/fa2: fewer calls captured (68 → 60) at the same 4.005 ms per call (4.005 ms → 4.013 ms, +0.2%); "
        "total 272.317 ms → 240.756 ms (-11.6%) follows the call count, not the kernels"
    ) in d["headlines"]
    assert nccl["change_basis"] == "mean_ns" and nccl["change"] == pytest.approx(0.414, abs=1e-3)
    assert any(h.startswith("collective/nccl time per call: 0.385 ms → 0.544 ms (+41.4%); fewer calls captured "
                            "(66 → 62)") for h in d["headlines"])  # fmt: skip
    assert not any(h.startswith("attention/fa2 time") for h in d["headlines"])
    html = (out / "diff.html").read_text()
    # the fa2 row is compared per call, and +0.2 % per call is painted neither green nor red
    (fa2_row,) = [r for r in html.split("<tr>") if '<td class="mono ">attention</td><td class="mono ">fa2</td>' in r]
    assert 'per call (calls captured differ)</td><td class="mono ">+0.2%</td>' in fa2_row
    assert "comparable on 2 of 7 aspects; not checked: model" in html
    # an Nsight export has no input shapes: the efficiency section says what is missing
    assert d["efficiency"]["rows"] == [] and d["efficiency"]["note"] == (
        "per-op efficiency not applicable: both runs: no op has a roofline: no input shapes in the trace "
        "(Kineto record_shapes=False, or an Nsight export)"
    )
    assert d["efficiency"]["note"] in text


def test_two_gpus_not_comparable_but_efficiency_is(tmp_module):
    """H100 (Hugging Face generate) against MI300X (SGLang): the times are not comparable (exit 1, no change
    reported), the per-op % of each GPU's own roofline is, and says which shapes it rests on."""
    import duckdb

    outs = {}
    for name in ("tracelens_h100_hf_qwen1.5-0.5b", "tracelens_mi300x_sglang_qwen3-8b_prefilldecode"):
        outs[name] = Path(tmp_module) / name
        r = cli("check", kineto_file(f"{name}.json.gz"), "-o", outs[name], "-q", "-j", "1")
        assert r.exit_code in (0, 1), r.stdout + r.stderr
    before, after = outs.values()
    out = Path(tmp_module) / "h100_mi300x"
    r = cli("diff", before, after, "--out", out)
    assert r.exit_code == 1, r.stdout + r.stderr
    d = json.loads((out / "diff.json").read_text())
    comp = d["comparability"]
    assert comp["verdict"] == "not comparable: GPU NVIDIA H100 80GB HBM3 → AMD Instinct MI300X"
    assert r.stdout.splitlines()[1].startswith(f"  {comp['verdict']} (4 of 7 aspects checked; not checked: model (")
    assert "  no change is reported (pass --force-compare to compare anyway)" in r.stdout
    assert d["step_time"] == [] and d["kernel_family_time"] == [] and d["headlines"] == []
    eff = d["efficiency"]
    assert eff["comparable"] and eff["verdict"] == "comparable" and comp["efficiency_comparable"]
    assert eff["before"]["gpu"] == ["NVIDIA H100 SXM5 80GB"] and eff["after"]["gpu"] == ["AMD Instinct MI300X"]
    (mm,) = [x for x in eff["rows"] if (x["op"], x["phase"]) == ("aten::mm", "prefill")]
    for side, folder in (("before", before), ("after", after)):  # the % from each run's own op_roofline
        with duckdb.connect(str(folder / "trace.duckdb"), read_only=True) as con:
            pct = con.execute("SELECT 100 * sum(roofline_ns) / sum(kernel_ns) FROM op_roofline WHERE op = 'aten::mm' "
                              "AND phase = 'prefill' AND NOT launch_bound").fetchone()[0]  # fmt: skip
        assert mm[f"{side}_pct"] == pytest.approx(pct)
    assert mm["before_pct"] == pytest.approx(63.9, abs=0.05) and mm["after_pct"] == pytest.approx(38.9, abs=0.05)
    assert (mm["before_shapes"], mm["after_shapes"], mm["common_shapes"]) == (3, 5, 0)
    line = (
        "aten::mm (prefill) efficiency: 63.9% → 38.9% of roofline (-25.0 points) on NVIDIA H100 SXM5 80GB → AMD "
        "Instinct MI300X; 3 → 5 shape(s), 0 in common: other shapes reach other fractions of the roofline"
    )
    assert line in eff["headlines"] and f"  {line}" in r.stdout
    assert "  per-op efficiency, comparable across GPUs: % of each GPU's own roofline" in r.stdout
    (flash,) = [x for x in eff["rows"] if x["op"] == "aten::_flash_attention_forward"]
    assert flash["after_pct"] is None and flash["why_none"] == "not run on AFTER"
    html = (out / "diff.html").read_text()
    assert "comparable across GPUs, although the times are not" in html and "What changed" not in html
    assert '<td class="mono worse">-25.0 pts</td>' in html
