"""An evaluation of the agent kit: questions an on-call engineer asks, with answers known from the vendored real
traces themselves, each answered the way docs/agents/tracediag-skill.md tells an agent to (analyze → explain →
query) by calling `tracediag mcp`'s tools through the official MCP SDK client over stdio, and the answer checked
against the known value. The numbers are read from the tools' outputs and checked against the raw trace or the
sample's scenario.json, not against a finding's wording (the rules' texts may change; the trace does not).

One server for the module, started without --runs-dir: its runs are in a temporary folder, which each answer says
and which is gone once the server stops."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SAMPLES, kineto_file
from mcp import Client, StdioServerParameters

SGLANG_QWEN3 = kineto_file("tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz")
QWEN3_CONFIG = REPO / "tests" / "data" / "qwen3-8b_config.json"
VLLM_GPTOSS = kineto_file("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")  # device name ""
SAMPLE = SAMPLES / "healthy_tp2"


def _env() -> dict[str, str]:
    # the checkout under test first (the client passes only a safe subset of the environment on)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


async def _ask() -> dict[str, Any]:
    # started in the checkout: its folder is the allowed root; no --runs-dir: the runs folder is temporary
    params = StdioServerParameters(command=sys.executable, args=["-m", "tracediag", "mcp"], env=_env(), cwd=str(REPO))
    got: dict[str, Any] = {}
    async with Client(params, read_timeout_seconds=240) as c:

        async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            r = await c.call_tool(name, args)
            assert not r.is_error, (name, r.content[0].text)
            return r.structured_content

        # what limits this run? analyze, then explain the verdict's rule, then query the evidence's table
        q3 = got["qwen3"] = await call("analyze", {"inputs": [str(SGLANG_QWEN3)], "model": str(QWEN3_CONFIG)})
        got["qwen3_why"] = await call("explain", {"run": q3["run"], "rule": q3["verdict"]["rule"]})
        got["qwen3_stalls"] = await call("query", {"run": q3["run"], "sql": "SELECT name, kind, dur_ns, gpu_idle_ns "
                                                   "FROM host_stalls ORDER BY gpu_idle_ns DESC LIMIT 3"})  # fmt: skip
        # which op family is furthest from the roofline? the rule that prices it
        got["qwen3_roofline"] = await call("explain", {"run": q3["run"], "rule": "KRN012"})
        # which GPU ran it, when the trace's device name is empty?
        oss = got["gptoss"] = await call("analyze", {"inputs": [str(VLLM_GPTOSS)]})
        got["gptoss_roofline"] = await call("explain", {"run": oss["run"], "rule": "KRN012"})
        got["gptoss_device"] = await call("query", {"run": oss["run"], "sql": "SELECT DISTINCT device_name, "
                                                    "device_num_sms FROM inputs WHERE rank IS NOT NULL"})  # fmt: skip
        # how many steps does the sample hold?
        sample = got["sample"] = await call("analyze", {"inputs": [str(SAMPLE)], "model": str(SAMPLE / "config.json")})
        got["sample_steps"] = await call("query", {"run": sample["run"], "sql": "SELECT rank, count(*) AS steps FROM "
                                                   "steps GROUP BY rank ORDER BY rank"})  # fmt: skip
    got["runs_after_stop"] = [Path(got[k]["run"]).exists() for k in ("qwen3", "gptoss", "sample")]
    return got


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    return asyncio.run(_ask())


def _raw(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_what_limits_the_sglang_qwen3_run_the_gpu_waiting_with_work_queued(answers):
    """Known from the trace: during one hipMemcpyWithStream of 493 ms (a synchronous copy under aten::copy_) the
    GPU is idle although resolve_future_token_ids was launched, after a hipStreamWaitEvent, 40 µs into the gap: the
    GPU waits on a device-side dependency with work queued, and the host call waits for it — half the steady GPU
    time."""
    events = _raw(SGLANG_QWEN3)["traceEvents"]
    longest_us = max(e["dur"] for e in events if e.get("name") == "hipMemcpyWithStream" and e.get("ph") == "X")
    q3, why = answers["qwen3"], answers["qwen3_why"]
    assert q3["findings"][0]["id"] == why["id"] and q3["verdict"]["rule"] == why["rule"] == "KRN006"  # the top one
    queued = why["values"]["longest_queued_gap"]
    assert queued["ending"].startswith("void (anonymous namespace)::resolve_future_token_ids_kernel")
    assert queued["waited_with"] == "hipStreamWaitEvent" and queued["launch_ns"] > queued["ts_ns"]
    host = [e for e in why["evidence"] if e.get("name") == "hipMemcpyWithStream"]
    assert host and abs(host[0]["dur_ns"] / 1000 - longest_us) <= 1  # the store's duration is the trace's
    stalls = answers["qwen3_stalls"]  # the copy waits for the GPU: it is no host stall (host_stalls holds none)
    assert stalls["columns"] == ["name", "kind", "dur_ns", "gpu_idle_ns"] and stalls["rows"] == []
    assert round(why["values"]["queued_idle_share_of_span"], 2) == 0.50


def test_which_op_family_is_furthest_from_the_roofline_gemm_in_prefill_at_39_percent(answers):
    """Known: GEMM in prefill at 39 % of the MI300X datasheet roofline — a datasheet peak, an upper bound."""
    v = answers["qwen3_roofline"]["values"]
    assert (v["family"], v["phase"], v["gpu"]) == ("GEMM", "prefill", "AMD Instinct MI300X")
    assert round(v["family_pct_of_roofline"]) == 39
    assert abs(100 * v["family_roofline_ns"] / v["family_kernel_ns"] - v["family_pct_of_roofline"]) < 0.1
    assert "upper bound" in v["roofs"]  # not an achievable rate: the skill file says never to claim it is
    assert v["family_best_pct_of_roofline"] > v["family_pct_of_roofline"]  # what its own kernels reach here


def test_the_gpu_of_the_vllm_trace_whose_device_name_is_empty_is_an_mi300x(answers):
    """Known: the gpt-oss vLLM trace's deviceProperties name is empty; 304 CUs and 192 GiB are an MI300X's."""
    props = _raw(VLLM_GPTOSS)["deviceProperties"]  # the 8 GPUs of the node, the kernels on one of them
    assert {(p["name"], p["numSms"]) for p in props} == {("", 304)}
    assert answers["gptoss_device"]["rows"] == [[None, 304]]  # what the trace says, queried: no name
    v = answers["gptoss_roofline"]["values"]
    assert v["gpu"] == "AMD Instinct MI300X" and "inferred" in v["roofs"] and "304 CUs" in v["roofs"]


def test_the_step_count_of_the_sample_is_its_scenario(answers):
    """Known: sample_traces/healthy_tp2/scenario.json lists the steps the generator recorded, on each rank."""
    scenario = json.loads((SAMPLE / "scenario.json").read_text())
    want = len(scenario["steps"])
    assert answers["sample"]["tp"] == scenario["tp"] == 2
    assert answers["sample_steps"]["rows"] == [[r, want] for r in range(scenario["tp"])]


def test_runs_without_out_say_they_are_temporary_and_are_gone_when_the_server_stops(answers):
    for key in ("qwen3", "gptoss", "sample"):
        s = answers[key]
        assert s["kept"] is False and s["kept_note"].startswith(f"temporary: {s['run']} is in the server's ")
        assert "removed when the server stops" in s["kept_note"] and "--runs-dir" in s["kept_note"]
    assert answers["runs_after_stop"] == [False, False, False]
