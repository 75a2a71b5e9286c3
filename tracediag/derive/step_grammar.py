"""Engine-step annotations as a grammar: every form the engines write, with what each number means.

`parse(name)` returns a `StepMarker` for a name one of the forms below matches exactly, else None;
`looks_like_step(name)` tells names that look like a step annotation (so that an unknown variant is
counted and reported, never silently dropped) from the other annotations of a trace.

Forms, with the source that writes each and the meaning of its numbers:

* vLLM V1 `execute_context_{n_ctx}({ctx_tok})_generation_{n_gen}({gen_tok})` — `Worker.annotate_profile`
  in vllm/v1/worker/gpu_worker.py, numbers from `compute_iteration_details(scheduler_output)`
  (vllm/v1/utils.py): n_ctx = requests in the context phase (no output token yet; chunked-prefill
  continuations count here), ctx_tok = tokens scheduled for them this step, n_gen = decode requests,
  gen_tok = their scheduled tokens (= n_gen without speculative decoding). A parenthesis holding several
  underscore-separated numbers (`(T_S)`) is read the same way: the first number is the tokens; the rest is
  kept verbatim (`extra`) and not interpreted — no writer of that variant was found to say what it means.
* the detailed (roofline) form
  `execute_{T}_context_{n_ctx}(sq{..}sk{..}sqsq{..}sqsk{..})_generation_{n_gen}(sq..sk..sqsq..sqsk..)` —
  vLLM with `--profiler-config.detailed_trace_annotation=true` (vllm/config/profiler.py: "detailed
  annotations with roofline metrics (sk, sqsq, sqsk)"), first shipped as AMD TraceLens patches of
  gpu_worker.py for ROCm vLLM images (AMD-AGI/TraceLens examples/custom_workflows/inference_analysis/
  vllm_v0.16.0.patch), and the same string from TraceLens' SGLang patch of
  `SchedulerProfilerMixin._build_profile_annotation` (sglang_roofline_patches/). T = total scheduled tokens;
  per phase sq = Σ query tokens, sk = Σ KV length *including* this step's tokens, sqsq = Σ sq², sqsk =
  Σ sq·sk. In SGLang traces this is the scheduler-level span: it encloses the forward's `step[...]` span.
* `execute_new_{n_new}_cached_{n_cached}` — vLLM V1 gpu_worker.py between 2025-11 and 2026-01 (#22496,
  replaced by the form above): new requests of the step, cached (running) requests.
* SGLang `step[{MODE} bs={bs}]`, `step[EXTEND bs={bs} toks={toks}]`, optionally followed by roofline
  `key=value` terms (`g_sqsq= g_sqsk= g_sk=` for DECODE, `c_...` for EXTEND, `c= g= c_sq= ... g_sq= ...`
  for MIXED) — `build_step_span_name(forward_batch)` in sgl-project/sglang python/sglang/srt/utils/
  profile_utils.py (opened around `ModelRunner.forward`): MODE = `ForwardMode` name, bs =
  `forward_batch.batch_size` (requests), toks = `extend_num_tokens` (new tokens of an extend).
  `draft step[...]` is a speculative draft forward: not an engine step of its own.
* TensorRT-LLM `[Executor] _forward_step {iter}: {n_ctx} ctx reqs, {n_gen} gen reqs` (and the forms without
  the iteration or the `[Executor]` prefix) — `PyExecutor._forward_step`'s NVTX range in
  tensorrt_llm/_torch/pyexecutor/py_executor.py: context (prefill, chunks included) and generation requests.
* `ProfilerStep#{n}` — `torch.profiler.profile.step()` with a schedule: the profiler's step counter.
* `.../model_runner.py(N): execute_model` — vLLM V0/V1 Python frames (with_stack=True): no numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ENGINE, PROFILER_STEP, EXECUTE_FRAME = 1, 2, 3  # precedence: lower wins per rank


@dataclass(frozen=True)
class StepMarker:
    form: str  # which form of the grammar matched (see the module docstring)
    source: str  # marker_source as reported: "vllm step annotation", "sglang step span", ...
    precedence: int  # ENGINE, PROFILER_STEP or EXECUTE_FRAME
    counts_as_step: bool = True  # False: a draft forward, an IDLE iteration, a graph capture
    ctx_reqs: int | None = None
    ctx_tokens: int | None = None
    gen_reqs: int | None = None
    gen_tokens: int | None = None
    tokens: int | None = None  # T when the form states the step's total
    ctx_kv_tokens: int | None = None  # Σ sk of the context requests (detailed forms)
    gen_kv_tokens: int | None = None  # Σ sk of the generation requests
    mode: str | None = None  # SGLang ForwardMode name
    phase: str | None = None  # phase the form states outright (SGLang mode); else from the request counts
    extra: str | None = None  # numbers present but not interpreted
    fields: dict[str, int] = field(default_factory=dict)  # every named number, for the evidence

    def step_phase(self) -> str | None:
        if self.phase:
            return self.phase
        if self.ctx_reqs is None and self.gen_reqs is None:
            return None
        ctx, gen = self.ctx_reqs or 0, self.gen_reqs or 0
        if ctx > 0 and gen > 0:
            return "mixed"
        if ctx > 0:
            return "prefill"
        if gen > 0:
            return "decode"
        return None

    def step_tokens(self) -> int | None:
        if self.tokens is not None:
            return self.tokens
        if self.ctx_tokens is None and self.gen_tokens is None:
            return None
        return (self.ctx_tokens or 0) + (self.gen_tokens or 0)


_NUMS = r"\d+(?:_\d+)*"
_VLLM = re.compile(rf"execute_context_(\d+)\(({_NUMS})\)_generation_(\d+)\(({_NUMS})\)")
_DETAIL_PART = r"\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
_VLLM_DETAILED = re.compile(rf"execute_(\d+)_context_(\d+){_DETAIL_PART}_generation_(\d+){_DETAIL_PART}")
_VLLM_NEW_CACHED = re.compile(r"execute_new_(\d+)_cached_(\d+)")
_SGLANG = re.compile(r"(draft )?step\[([A-Z][A-Z0-9_]*) bs=(\d+)(?: toks=(\d+))?((?: [a-z_]+=\d+)*)\]")
_TRTLLM = re.compile(r"(?:\[Executor\] )?_forward_step(?: (\d+))?: (\d+) ctx reqs, (\d+) gen reqs")
_PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)")
_EXECUTE_FRAME = re.compile(r"(?:^|.*[\s/])\w*model_runner\w*\.py\(\d+\): execute_model")
# Names that look like a step annotation; one that parse() does not understand is counted and reported.
_STEP_LIKE = re.compile(r"^(?:execute_|(?:draft )?step\[|ProfilerStep|\[Executor\]|_forward_step)")

# SGLang ForwardMode (python/sglang/srt/model_executor/forward_batch_info.py) -> phase; None: not a step.
_SGLANG_PHASE = {
    "EXTEND": "prefill",
    "PREFILL": "prefill",
    "SPLIT_PREFILL": "prefill",
    "DECODE": "decode",
    "MIXED": "mixed",
    "TARGET_VERIFY": "decode",  # speculative decoding: the target model verifies k+1 tokens per request
}
_SGLANG_NOT_A_STEP = {"IDLE", "DUMMY_FIRST"}  # an empty iteration (DP attention idle rank, warm-up)


def _first(nums: str) -> tuple[int, str | None]:
    head, _, rest = nums.partition("_")
    return int(head), (rest or None)


def _vllm_v1_marker(m: re.Match) -> StepMarker:
    """vLLM v1's step annotation: requests and tokens of the context and generation sides."""
    ctx_tok, ctx_rest = _first(m.group(2))
    gen_tok, gen_rest = _first(m.group(4))
    extra = "; ".join(f"{k}: {v}" for k, v in (("context", ctx_rest), ("generation", gen_rest)) if v)
    return StepMarker(
        form="vllm_v1",
        source="vllm step annotation",
        precedence=ENGINE,
        ctx_reqs=int(m.group(1)),
        ctx_tokens=ctx_tok,
        gen_reqs=int(m.group(3)),
        gen_tokens=gen_tok,
        extra=extra or None,
        fields={
            "ctx_reqs": int(m.group(1)),
            "ctx_tokens": ctx_tok,
            "gen_reqs": int(m.group(3)),
            "gen_tokens": gen_tok,
        },
    )


def _detailed_marker(m: re.Match) -> StepMarker:
    """The detailed vLLM annotation: T and per side the requests, query and key tokens and their squares."""
    g = [int(x) for x in m.groups()]
    t, n_ctx, c_sq, c_sk, c_sqsq, c_sqsk, n_gen, g_sq, g_sk, g_sqsq, g_sqsk = g
    return StepMarker(
        form="detailed",
        source="vllm step annotation (detailed)",
        precedence=ENGINE,
        ctx_reqs=n_ctx,
        ctx_tokens=c_sq,
        gen_reqs=n_gen,
        gen_tokens=g_sq,
        tokens=t,
        ctx_kv_tokens=c_sk,
        gen_kv_tokens=g_sk,
        fields=dict(
            T=t,
            ctx_reqs=n_ctx,
            c_sq=c_sq,
            c_sk=c_sk,
            c_sqsq=c_sqsq,
            c_sqsk=c_sqsk,
            gen_reqs=n_gen,
            g_sq=g_sq,
            g_sk=g_sk,
            g_sqsq=g_sqsq,
            g_sqsk=g_sqsk,
        ),
    )


def _sglang_marker(m: re.Match) -> StepMarker:
    """An SGLang step span: its mode (EXTEND, DECODE, MIXED, ...) gives the phase and which count is T."""
    draft, mode, bs = m.group(1), m.group(2), int(m.group(3))
    toks = int(m.group(4)) if m.group(4) else None
    kv = {k: int(v) for k, v in (t.split("=") for t in m.group(5).split())}
    phase = _SGLANG_PHASE.get(mode)
    tokens = toks if mode == "EXTEND" else bs if mode == "DECODE" else None
    if mode == "MIXED" and "c_sq" in kv and "g_sq" in kv:
        tokens = kv["c_sq"] + kv["g_sq"]
    return StepMarker(
        form="sglang_step",
        source="sglang step span",
        precedence=ENGINE,
        counts_as_step=not draft and mode not in _SGLANG_NOT_A_STEP,
        ctx_reqs=kv.get("c", bs if phase == "prefill" else 0 if phase == "decode" else None),
        gen_reqs=kv.get("g", bs if phase == "decode" else 0 if phase == "prefill" else None),
        ctx_tokens=kv.get("c_sq", toks if phase == "prefill" else None),
        gen_tokens=kv.get("g_sq", bs if mode == "DECODE" else None),
        tokens=tokens,
        ctx_kv_tokens=kv.get("c_sk"),
        gen_kv_tokens=kv.get("g_sk"),
        mode=mode,
        phase=phase,
        fields={"bs": bs, **({"toks": toks} if toks is not None else {}), **kv},
    )


def parse(name: str) -> StepMarker | None:
    """The step marker `name` is, or None (exact match of one form)."""
    if m := _VLLM.fullmatch(name):
        return _vllm_v1_marker(m)
    if m := _VLLM_DETAILED.fullmatch(name):
        return _detailed_marker(m)
    if m := _VLLM_NEW_CACHED.fullmatch(name):
        new, cached = int(m.group(1)), int(m.group(2))
        return StepMarker(
            form="vllm_new_cached",
            source="vllm step annotation",
            precedence=ENGINE,
            ctx_reqs=new,
            gen_reqs=cached,
            fields={"new_reqs": new, "cached_reqs": cached},
        )
    if m := _SGLANG.fullmatch(name):
        return _sglang_marker(m)
    if m := _TRTLLM.fullmatch(name):
        n_ctx, n_gen = int(m.group(2)), int(m.group(3))
        f = {"ctx_reqs": n_ctx, "gen_reqs": n_gen} | ({"iter": int(m.group(1))} if m.group(1) else {})
        return StepMarker(
            form="trtllm_forward_step",
            source="tensorrt-llm executor step",
            precedence=ENGINE,
            ctx_reqs=n_ctx,
            gen_reqs=n_gen,
            fields=f,
        )
    if m := _PROFILER_STEP.fullmatch(name):
        return StepMarker(
            form="profiler_step", source="ProfilerStep", precedence=PROFILER_STEP, fields={"n": int(m.group(1))}
        )
    if _EXECUTE_FRAME.fullmatch(name):
        return StepMarker(form="execute_model_frame", source="execute_model frame", precedence=EXECUTE_FRAME)
    return None


def looks_like_step(name: str) -> bool:
    """A name with the head of a step annotation (whether or not parse() understands it)."""
    return bool(_STEP_LIKE.match(name))
