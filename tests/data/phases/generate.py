"""Generate real PyTorch profiler (Kineto) traces of single-process generation loops for the phase tests.

Three engines that sample_traces/ (vLLM-shaped, one annotation per step) does not cover, all run on the
CPU with a small Llama-shaped decoder (nn.Embedding, RMSNorm, GQA attention through
F.scaled_dot_product_attention, SiLU MLP, lm_head) and profiled with torch.profiler; every file is the
profiler's own ``export_chrome_trace`` output, never edited:

- ``hf_generate``: a Hugging Face style ``generate()`` loop (prefill of one long prompt, then decode
  steps with a growing KV cache) inside ONE ``ProfilerStep#N`` — the profiler step wraps the whole
  generation, so the steps must be split per forward pass.
- ``annotated_prefill``: only the prefill forward is wrapped in a vLLM-style step annotation; the decode
  forwards that follow carry no annotation at all (the fallback must still find them).
- ``long_context_decode``: decode steps of 16 sequences over a 4,096-token KV cache each (the cache is
  filled with random values before profiling, outside the trace), each step wrapped in vLLM's
  ``execute_context_0(0)_generation_16(16)``: KV reads dwarf the weight reads.
- ``memory_bound_decode``: decode steps of one sequence through a wider fp32 model (~394 MB of weights),
  so that a step is dominated by streaming the weights from memory; the generator also measures the
  machine's single-thread read bandwidth (``torch.sum`` over a 512 MiB tensor) and records it in
  scenario.json — the bandwidth to compare the trace with (KRN005's --hbm-bandwidth).

Usage (torch is the project's ``torch`` extra; ~10 s on 2 vCPU)::

    python tests/data/phases/generate.py            # rewrites tests/data/phases/<scenario>/

Each scenario folder gets ``rank0.pt.trace.json.gz``, ``config.json`` (Hugging Face format, the values
the run used) and ``scenario.json`` (parameters and the steps a diagnosis should find).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Shape:
    num_hidden_layers: int = 2
    hidden_size: int = 128
    intermediate_size: int = 344
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 1024
    torch_dtype: str = "bfloat16"

    def hf_config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
        }


class Layer(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        d, h, kv = s.head_dim, s.num_attention_heads, s.num_key_value_heads
        self.s = s
        self.qkv = nn.Linear(s.hidden_size, (h + 2 * kv) * d, bias=False)
        self.o = nn.Linear(h * d, s.hidden_size, bias=False)
        self.gate_up = nn.Linear(s.hidden_size, 2 * s.intermediate_size, bias=False)
        self.down = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    @staticmethod
    def norm(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        s = self.s
        b, t, _ = x.shape
        h, kv, d = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        q, k, v = self.qkv(self.norm(x)).split([h * d, kv * d, kv * d], dim=-1)
        q = q.view(b, t, h, d).transpose(1, 2)
        k = k.view(b, t, kv, d).transpose(1, 2)
        v = v.view(b, t, kv, d).transpose(1, 2)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h * d))
        g, u = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u), [k, v]


class TinyLM(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.num_hidden_layers))
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, caches: list | None) -> tuple[torch.Tensor, list]:
        x = self.embed(ids)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, caches[i] if caches is not None else None)
            new.append(c)
        return self.lm_head(Layer.norm(x[:, -1:, :])), new  # logits of the last position only


def generate(model: TinyLM, ids: torch.Tensor, new_tokens: int, annotate_prefill: bool = False) -> torch.Tensor:
    """Greedy decoding as Hugging Face generate() does it: one forward per token, growing KV cache."""
    b, t = ids.shape
    if annotate_prefill:
        with record_function(f"execute_context_{b}({b * t})_generation_0(0)"):
            logits, caches = model(ids, None)
    else:
        logits, caches = model(ids, None)
    tok = logits.argmax(-1)
    out = [tok]
    for _ in range(new_tokens - 1):
        logits, caches = model(tok, caches)
        tok = logits.argmax(-1)
        out.append(tok)
    return torch.cat(out, dim=1)


@dataclass(frozen=True)
class Scenario:
    name: str
    batch: int
    prompt_len: int
    new_tokens: int
    description: str
    context_len: int = 0  # decode-only scenarios: KV tokens per sequence before the first recorded step
    shape: Shape = Shape()


SCENARIOS = {
    "hf_generate": Scenario(
        "hf_generate",
        batch=1,
        prompt_len=1024,
        new_tokens=6,
        description="HF-style generate(): 1 prefill forward of 1,024 prompt tokens + 5 decode forwards, all "
        "inside one ProfilerStep#N (the profiler step wraps the whole generate call).",
    ),
    "annotated_prefill": Scenario(
        "annotated_prefill",
        batch=2,
        prompt_len=128,
        new_tokens=6,
        description="Only the prefill forward is wrapped in execute_context_2(256)_generation_0(0); the 5 decode "
        "forwards after it carry no annotation, and there is no ProfilerStep.",
    ),
    "long_context_decode": Scenario(
        "long_context_decode",
        batch=16,
        prompt_len=0,
        new_tokens=4,
        context_len=4096,
        description="4 decode steps of 16 sequences, each over a 4,096-token KV cache (random values filled "
        "before profiling), each wrapped in execute_context_0(0)_generation_16(16).",
    ),
    "memory_bound_decode": Scenario(
        "memory_bound_decode",
        batch=1,
        prompt_len=0,
        new_tokens=4,
        context_len=64,
        shape=Shape(
            hidden_size=2048,
            intermediate_size=5632,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=4096,
            torch_dtype="float32",
        ),
        description="4 decode steps of 1 sequence over a 64-token KV cache through an fp32 model with ~394 MB of "
        "weights: each step streams the weights once; the machine's read bandwidth is measured beside it.",
    ),
}

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def read_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Single-thread read bandwidth of this machine: best of `repeats` torch.sum over a `mib` MiB fp32 tensor."""
    import time

    a = torch.ones(mib * 2**20 // 4)
    a.sum()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.numel() * 4 / best / 1e9


def run(sc: Scenario, out: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    shape = sc.shape
    dtype = DTYPES[shape.torch_dtype]
    model = TinyLM(shape).to(dtype).eval()
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "rank0.pt.trace.json.gz"
    steps: list[dict] = []
    with torch.inference_mode():
        if sc.context_len:
            kv, d = shape.num_key_value_heads, shape.head_dim

            def cache(n: int) -> list:
                return [
                    [torch.randn(sc.batch, kv, n, d, dtype=dtype) for _ in range(2)]
                    for _ in range(shape.num_hidden_layers)
                ]

            tok = torch.randint(0, shape.vocab_size, (sc.batch, 1))
            model(tok, cache(64))  # warm-up, not profiled
            caches = cache(sc.context_len)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for i in range(sc.new_tokens):
                    with record_function(f"execute_context_0(0)_generation_{sc.batch}({sc.batch})"):
                        logits, caches = model(tok, caches)
                        tok = logits.argmax(-1)
                    steps.append({"phase": "decode", "T": sc.batch, "context_len": sc.context_len + i})
            prof.export_chrome_trace(str(trace))
        else:
            ids = torch.randint(0, shape.vocab_size, (sc.batch, sc.prompt_len))
            generate(model, ids[:, :32], 2)  # warm-up, not profiled
            if sc.name == "hf_generate":
                sched = schedule(wait=0, warmup=1, active=1, repeat=1)
                with profile(
                    activities=[ProfilerActivity.CPU],
                    record_shapes=True,
                    schedule=sched,
                    on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
                ) as prof:
                    for _ in range(2):  # profiler warm-up step (discarded), then the recorded step
                        generate(model, ids, sc.new_tokens)
                        prof.step()
            else:
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    generate(model, ids, sc.new_tokens, annotate_prefill=True)
                prof.export_chrome_trace(str(trace))
            steps.append({"phase": "prefill", "T": sc.batch * sc.prompt_len, "context_len": sc.prompt_len})
            for i in range(1, sc.new_tokens):
                steps.append({"phase": "decode", "T": sc.batch, "context_len": sc.prompt_len + i})
    (out / "config.json").write_text(json.dumps(shape.hf_config(), indent=2) + "\n")
    record = {
        "scenario": sc.name,
        "description": sc.description,
        "torch": torch.__version__,
        "batch": sc.batch,
        "prompt_len": sc.prompt_len,
        "new_tokens": sc.new_tokens,
        "context_len": sc.context_len,
        "kv_bytes_per_token": 2
        * shape.num_hidden_layers
        * shape.num_key_value_heads
        * shape.head_dim
        * model.lm_head.weight.element_size(),
        "weight_params": sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embed")),
        "head_dim": shape.head_dim,
        "steps": steps,
    }
    if sc.name == "memory_bound_decode":
        record["weight_bytes"] = sum(
            p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("embed")
        )
        record["measured_read_bandwidth_gbs"] = round(read_bandwidth_gbs(), 2)
        record["bandwidth_how"] = "best of 5 single-thread torch.sum over a 512 MiB fp32 tensor, right after the run"
    (out / "scenario.json").write_text(json.dumps(record, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    for name in args.scenario or sorted(SCENARIOS):
        run(SCENARIOS[name], args.out / name)
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
