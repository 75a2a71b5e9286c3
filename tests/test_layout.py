"""The parallel layout from evidence (tracediag/derive/layout.py) on real traces: TP/DP/EP groups, p = 1 where the
trace shows no tensor-parallel group, and --tp."""

from __future__ import annotations

import pytest
from conftest import EXTERNAL, SAMPLES

from tracediag.analysis import analyze
from tracediag.errors import UsageError

KINETO = EXTERNAL / "kineto"


def _layout(path, **kw):
    return analyze([path], **kw).to_dict()["layout"]


def test_ddp_trace_has_no_tensor_parallel_degree_and_names_its_dp_group():
    lay = _layout(KINETO / "tracelens_mi300x_rank0of8_rccl_ddp.json.gz")
    assert lay["workload"] == "training"
    assert lay["tp"]["p"] == 1 and "data-parallel group of 8 (default_pg)" in lay["tp"]["source"]
    (dp,) = lay["groups"]
    assert (dp["kind"], dp["name"], dp["description"], dp["size"]) == ("DP", "0", "default_pg", 8)
    assert dp["collectives"] == {"all_reduce": 6, "broadcast": 6}
    assert "distributedInfo.pg_config" in dp["evidence"]


@pytest.mark.parametrize(
    "name",
    [
        "hta_a100_rank0of2_nccl_args.json.gz",  # DDP, world size 2
        "hta_v100_ns_resolution.pt.trace.json.gz",  # DDP with a world of one
        "hta_sampled_rank-0.json.gz",  # TorchRec: all-to-all embeddings + all-reduce, world size 128
    ],
)
def test_training_jobs_do_not_get_their_world_size_as_tp(name):
    lay = _layout(KINETO / name)
    assert lay["workload"] == "training" and lay["tp"]["p"] == 1


@pytest.mark.parametrize(
    "name",
    [
        "tracelens_h100_hf_qwen1.5-0.5b.json.gz",  # no distributedInfo groups, no collectives
        "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz",  # 15 vLLM groups, all of size 1
        "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz",
    ],
)
def test_single_process_without_tp_collectives_is_p1(name):
    lay = _layout(KINETO / name)
    assert lay["tp"] == {"p": 1, "source": "single process and no tensor-parallel collectives"}


def test_vllm_groups_of_one_rank_are_summarised():
    lay = _layout(KINETO / "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")
    assert lay["groups"] == [] and lay["notes"] == [
        "15 process group(s) of a single rank (no parallelism) are not listed"
    ]


def test_two_ranks_exchanging_only_all_to_all_have_no_tp_group():
    """nsys-ai's 2×H100 export: 66 all-to-alls (NVTX `AllToAll4D`, the Ulysses sequence-parallel exchange) beside
    flash attention and no MoE kernel — a sequence-parallel group, not an expert-parallel one."""
    lay = _layout(EXTERNAL / "nsys" / "nsysai_2xh100_before.sqlite")
    assert lay["tp"]["p"] == 1 and "no tensor-parallel group" in lay["tp"]["source"]
    assert [g["kind"] for g in lay["groups"]] == ["SP"] and "Ulysses" in lay["groups"][0]["evidence"]


def test_inference_tp_group_from_the_all_reduces():
    lay = _layout(SAMPLES / "healthy_tp2")
    assert lay["workload"] == "inference" and lay["tp"]["p"] == 2
    assert [g["kind"] for g in lay["groups"]] == ["TP"]
    sp = _layout(SAMPLES / "sequence_parallel_tp2")
    assert sp["tp"]["p"] == 2 and sp["groups"][0]["kind"] == "TP"
    assert set(sp["groups"][0]["collectives"]) == {"reduce_scatter", "all_gather"}


def test_tp_option_wins_and_is_checked():
    assert _layout(SAMPLES / "healthy_tp2", tp=4)["tp"] == {"p": 4, "source": "--tp option"}
    with pytest.raises(UsageError):
        analyze([SAMPLES / "healthy_tp2"], tp=0)
