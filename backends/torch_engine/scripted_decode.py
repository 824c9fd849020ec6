"""The CPU decode step's layer loop as one TorchScript call: the CPU's counterpart of cuda_graphs.py.

Why (issue 24 item 3).  A batch-1 CPU decode step of the starter spends ~4 ms of its ~13.6 ms (2 threads, Zen 4)
in Python: 30 layers x ~60 Python calls around ~30 small ops each (Block.forward, the norms, RoPE, the KV write,
the attention's gathers, QuantLinear.forward).  A second thread shortens the matmuls but not that, which is why
the engine gained 1.17x from its second thread against llama.cpp's 1.63x.  Scripted, the loop runs in
TorchScript's C++ interpreter: the same ATen ops in the same order on the same tensors, without the Python
around them.

Bit for bit the eager step.  The script calls exactly the ops the eager decode path calls (kernels/rmsnorm.py
rms_norm_torch's layer_norm of [x, -x], rope_torch's roll and addcmul, write_kv's head-major index_copy_,
paged_attention_torch's gathers (or its in-place run of blocks) and one masked SDPA, QuantLinear's packed-kernel
call, silu_and_mul_torch), so a decode row gets the same bits here as in a step that runs eagerly (one with
prompt chunks beside it): a seeded request's text does not depend on which steps were scripted.  The runner
checks it on the first scripted step (both run, their outputs must be equal) and runs eagerly from then on if
they differ; tests check it too.

Where it applies (`unavailable_reason` says why not): CPU, the "torch" kernel set, bf16, the shared pre-norm
`Block` (Llama, Mistral, SmolLM2, Qwen3 with its QK-norm) with SiLU, or Gemma 3's sandwich-norm `GemmaBlock`
with GeGLU; sliding windows of one size (their layers' own RoPE tables and windowed mask, as
with_sliding_window builds it for the eager path); no biases, full rotary dimensions, every projection on
torch's packed int4/int8 kernels (a split one, split_linear.py, part by part, its outputs concatenated as
SplitLinear.forward does), head-major KV caches, no offload.  Steps it
takes (`accepts`): decode-only, every row on the quantized kernels (quantize.QUANTIZED_ROWS).
HEARTH_SCRIPTED_DECODE=0 turns it off.  TorchScript is deprecated in torch 2.x (it warns once; the warning is
silenced here) but still ships; if a torch drops it, scripting fails and the engine runs eagerly, saying why.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from backends.torch_engine.quantize import QUANTIZED_ROWS, QuantLinear
from backends.torch_engine.split_linear import SplitLinear
from kernels.attention import (
    AttentionMetadata,
    _head_major_memory,
    _mask_bias,
    head_major_gather_rows,
    head_major_write_rows,
    with_sliding_window,
)
from kernels.rmsnorm import _padded_weight
from kernels.rope import _full_tables

ENV_VAR = "HEARTH_SCRIPTED_DECODE"
INT4, INT8_SPLIT, INT8 = 0, 1, 2  # a projection's packed kind (kernels/quant_matmul_cpu.py CpuPackedWeight.kind)
_KINDS = {"int4": INT4, "int8-split": INT8_SPLIT, "int8": INT8}


class _Layers(nn.Module):
    """The decoder layers of one model, flattened into lists the script indexes (4 projections a layer:
    qkv, o, gate_up, down; a split projection's parts follow each other, `firsts` and `counts` say where).
    Scripted by `ScriptedDecode`; `forward` mirrors models/layers.py Block.forward on the eager CPU kernels op
    for op (see the module docstring)."""

    def __init__(
        self,
        packed: list[torch.Tensor],
        packed_lo: list[torch.Tensor],
        scales: list[torch.Tensor],
        scales_lo: list[torch.Tensor],
        kinds: list[int],
        groups: list[int],
        firsts: list[int],
        counts: list[int],
        norms: list[torch.Tensor],
        qk_norms: list[torch.Tensor],
        k_memory: list[torch.Tensor],
        v_memory: list[torch.Tensor],
        dims: tuple[int, int, int, int, int],
        eps: float,
        scale: float,
        sandwich: bool,
        gelu: bool,
        local_rope: list[bool],
        windowed: list[bool],
    ) -> None:
        super().__init__()
        self.packed, self.packed_lo, self.scales, self.scales_lo = packed, packed_lo, scales, scales_lo
        self.kinds, self.groups = kinds, groups  # per part
        self.firsts, self.counts = firsts, counts  # per projection: its first part and how many
        # per layer ([weight, 0] float32: rms_norm_torch): input norm, pre-MLP norm; with `sandwich` (Gemma 3's
        # block) four: input, after attention, pre-MLP, after the MLP
        self.norms = norms
        self.sandwich, self.gelu = sandwich, gelu  # Gemma 3's block and GeGLU (gelu_tanh_and_mul_torch)
        # per layer: whether it rotates with the sliding-window layers' RoPE tables (Block.local_rope) and
        # attends through the window's mask (Attention.window)
        self.local_rope, self.windowed = local_rope, windowed
        # per layer: Q's and K's per-head norms (Qwen3), as norms; without QK-norm one unused tensor (TorchScript
        # cannot type an empty list)
        self.qk_norm = len(qk_norms) > 0
        self.qk_norms = qk_norms if qk_norms else [torch.empty(0)]
        self.k_memory, self.v_memory = k_memory, v_memory  # (kv_heads * num_blocks * block_size, D) per layer
        self.n_layers = len(k_memory)
        self.hidden, self.n_heads, self.n_kv_heads, self.head_dim, self.block_size = dims
        # the same memory as (kv_heads, num_blocks * block_size, D) planes: head_major_run's view
        self.k_planes = [m.view(self.n_kv_heads, -1, self.head_dim) for m in k_memory]
        self.v_planes = [m.view(self.n_kv_heads, -1, self.head_dim) for m in v_memory]
        self.eps, self.scale = eps, scale

    def linear(self, x: torch.Tensor, p: int) -> torch.Tensor:
        """Projection p: its one part's kernel, or a split projection's parts concatenated (SplitLinear.forward)."""
        x = x.contiguous()
        first, count = self.firsts[p], self.counts[p]
        if count == 1:
            return self.part(x, first)
        outs: list[torch.Tensor] = []
        for j in range(count):
            outs.append(self.part(x, first + j))
        return torch.cat(outs, dim=-1)

    def part(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """QuantLinear's decode path for part i: cpu_rows_kernel(w)(x) (x contiguous)."""
        kind = self.kinds[i]
        if kind == 0:
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed[i], self.groups[i], self.scales[i])
        if kind == 1:
            hi = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed[i], self.groups[i], self.scales[i])
            lo = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed_lo[i], self.groups[i], self.scales_lo[i])
            return hi.add_(lo)
        return torch.ops.aten._weight_int8pack_mm(x, self.packed[i], self.scales[i])

    def norm(self, x: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
        """kernels/rmsnorm.py rms_norm_torch on CPU: x (rows, width), padded its [weight, 0]."""
        width = x.shape[-1]
        doubled = torch.cat([x, -x], dim=-1)
        out = torch.nn.functional.layer_norm(doubled, [2 * width], padded, None, self.eps)
        return out[:, :width].to(x.dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos_full: torch.Tensor,
        sin_signed: torch.Tensor,
        cos_local: torch.Tensor,
        sin_local: torch.Tensor,
        write_rows: torch.Tensor,
        gather_rows: torch.Tensor,
        first_block: int,
        length: int,
        bias: torch.Tensor,
        bias_local: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (n, hidden) embeddings of n decode rows; cos_full, sin_signed: rope_torch's (n, 1, D) tables
        (cos_local, sin_local: the sliding-window layers'); write_rows: (n * kv_heads,) memory rows of the new
        K/V (write_kv); gather_rows: (n, kv_heads, blocks) memory blocks of each row's context
        (paged_attention_torch), unread when first_block >= 0: one row whose blocks are one run from there,
        read in place (head_major_run); length: blocks * block_size; bias: (n, 1, 1, length) float32 mask
        (bias_local: narrowed to the window, with_sliding_window).  Returns (last layer's MLP output, the
        residual stream before it)."""
        n = x.shape[0]
        heads, kv_heads, d, bs = self.n_heads, self.n_kv_heads, self.head_dim, self.block_size
        per = 4 if self.sandwich else 2  # norms a layer
        residual = x
        h = self.norm(x, self.norms[0])
        for layer in range(self.n_layers):
            if layer > 0:
                residual = x + residual
                h = self.norm(residual, self.norms[per * layer])
            qkv = self.linear(h, 4 * layer).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            q = qkv[0].reshape(n, heads, d)
            k = qkv[1].reshape(n, kv_heads, d)
            v = qkv[2].view(n, kv_heads, d)
            if self.qk_norm:  # Attention.forward's q_norm / k_norm over each head's vector
                q = self.norm(q.reshape(-1, d), self.qk_norms[2 * layer]).view(n, heads, d)
                k = self.norm(k.reshape(-1, d), self.qk_norms[2 * layer + 1]).view(n, kv_heads, d)
            cos_t, sin_t = (cos_local, sin_local) if self.local_rope[layer] else (cos_full, sin_signed)
            qk = torch.cat([q, k], dim=1).float()
            qk = (qk * cos_t).addcmul_(qk.roll(d // 2, -1), sin_t).to(q.dtype)
            q, k = qk[:, :heads], qk[:, heads:]
            k_memory, v_memory = self.k_memory[layer], self.v_memory[layer]
            k_memory.index_copy_(0, write_rows, k.reshape(-1, d).to(k_memory.dtype))
            v_memory.index_copy_(0, write_rows, v.reshape(-1, d).to(v_memory.dtype))
            if first_block >= 0:
                keys = self.k_planes[layer].narrow(1, first_block * bs, length).unsqueeze(0).to(q.dtype)
                vals = self.v_planes[layer].narrow(1, first_block * bs, length).unsqueeze(0).to(q.dtype)
            else:
                flat_rows = gather_rows.reshape(-1)
                keys = torch.index_select(k_memory.view(-1, bs * d), 0, flat_rows)
                vals = torch.index_select(v_memory.view(-1, bs * d), 0, flat_rows)
                keys = keys.view(n, kv_heads, length, d).to(q.dtype)
                vals = vals.view(n, kv_heads, length, d).to(q.dtype)
            qs = q.view(n, kv_heads, heads // kv_heads, d)
            mask = bias_local if self.windowed[layer] else bias
            attn = torch.nn.functional.scaled_dot_product_attention(qs, keys, vals, attn_mask=mask, scale=self.scale)
            attn = self.linear(attn.view(n, heads, d).reshape(n, -1), 4 * layer + 1)
            if self.sandwich:
                attn = self.norm(attn, self.norms[per * layer + 1])
            residual = attn + residual
            h = self.norm(residual, self.norms[per * layer + per // 2])  # the pre-MLP norm: 1 of 2, 2 of 4
            gate_up = self.linear(h, 4 * layer + 2).chunk(2, dim=-1)
            if self.gelu:
                act = torch.nn.functional.gelu(gate_up[0], approximate="tanh") * gate_up[1]
            else:
                act = torch.nn.functional.silu(gate_up[0]) * gate_up[1]
            x = self.linear(act, 4 * layer + 3)
            if self.sandwich:
                x = self.norm(x, self.norms[per * layer + 3])
        return x, residual


def unavailable_reason(model: nn.Module, ops_name: str, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the scripted decode step cannot run this model (None: it can); see the module docstring."""
    # lazy: the models import this module (layers.py), so it cannot import them at its top
    from backends.torch_engine.models.gemma3 import GemmaBlock
    from backends.torch_engine.models.layers import Block, DecoderModel  # lazy: as above

    if os.environ.get(ENV_VAR, "1") == "0":
        return f"off ({ENV_VAR}=0)"
    if device.type != "cpu" or ops_name != "torch" or dtype != torch.bfloat16:
        return "off (only bf16 on the CPU's torch kernels)"
    if not isinstance(model, DecoderModel) or getattr(model, "offload", None) is not None:
        return "off (not a plain decoder model in memory)"
    cfg = model.cfg
    if (0 < cfg.rope_dim < cfg.head_dim) or cfg.activation not in ("silu", "gelu_tanh"):
        return "off (partial RoPE or this activation: the eager path runs them)"
    if cfg.rope_attn_factor != 1.0 or cfg.n_heads % cfg.n_kv_heads:
        return "off (this family's RoPE options run on the eager path)"
    kinds = {type(layer) for layer in model.layers}
    if len(kinds) != 1 or not kinds <= {Block, GemmaBlock}:
        return f"off ({', '.join(sorted(k.__name__ for k in kinds))} layers run on the eager path)"
    windows = {layer.attn.window for layer in model.layers} - {0}
    if len(windows) > 1:
        return "off (sliding windows of more than one size run on the eager path)"
    for layer in model.layers:
        for proj in _projections(layer):
            if not isinstance(proj, QuantLinear) or proj._cpu is None or proj._cpu_rows is None:
                return "off (some projections have biases or input scales, or are not on the packed CPU kernels)"
    return None


def _packed_parts(layers: nn.ModuleList) -> tuple[list[list[Any]], list[int], list[int]]:
    """The packed kernels' operands of every layer's projections, part by part in the script's order: the lists
    (packed, packed_lo, scales, scales_lo, kind, group size), "_lo" the low half of an int8-split part and empty
    otherwise; and per projection its first part and part count (a split projection has several)."""
    columns: list[list[Any]] = [[], [], [], [], [], []]
    firsts, counts = [], []
    empty = torch.empty(0)
    for layer in layers:
        for proj in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            parts = list(proj.parts) if isinstance(proj, SplitLinear) else [proj]
            firsts.append(len(columns[0]))
            counts.append(len(parts))
            for part in parts:
                w = part._cpu
                split = w.kind == "int8-split"
                row = (
                    w.packed[0] if split else w.packed,
                    w.packed[1] if split else empty,
                    w.scales[0] if split else w.scales,
                    w.scales[1] if split else empty,
                    _KINDS[w.kind],
                    w.group_size,
                )
                for column, value in zip(columns, row):
                    column.append(value)
    return columns, firsts, counts


def _projections(layer: nn.Module) -> list[nn.Module]:
    """A layer's projections in the script's order (qkv, o, gate_up, down), a split one as its parts."""
    out: list[nn.Module] = []
    for proj in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        out += list(proj.parts) if isinstance(proj, SplitLinear) else [proj]
    return out


class ScriptedDecode:
    """ScriptedDecode(model, kv_caches): the scripted layer loop of `model` over its head-major `kv_caches`.
    `accepts(meta, num_rows)`, then `layers(x, cos, sin, meta, eager)` -> (MLP output, residual) as the eager
    loop returns them.  Raises RuntimeError when the caches are not head-major or TorchScript cannot script it.

    `check`: the first step's comparison with the eager loop (None before it), {"verdict": "ok"|"mismatch", ...};
    after a mismatch `accepts` says no from then on."""

    check: dict[str, Any] | None = None

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        cfg = model.cfg
        (packed, packed_lo, scales, scales_lo, kinds, groups), firsts, counts = _packed_parts(model.layers)
        norms: list[torch.Tensor] = []
        qk_norms: list[torch.Tensor] = []
        sandwich = hasattr(model.layers[0], "attn_post_norm")  # Gemma 3's block (unavailable_reason: one kind)
        for layer in model.layers:
            if sandwich:
                order = (layer.input_norm, layer.attn_post_norm, layer.post_norm, layer.ffn_post_norm)
            else:
                order = (layer.input_norm, layer.post_norm)
            norms += [_padded_weight(norm.weight) for norm in order]
            if cfg.qk_norm:
                qk_norms += [_padded_weight(layer.attn.q_norm.weight), _padded_weight(layer.attn.k_norm.weight)]
        k_memory, v_memory = [], []
        for k_cache, v_cache in kv_caches:
            km, vm = _head_major_memory(k_cache), _head_major_memory(v_cache)
            if km is None or vm is None:
                raise RuntimeError("the KV caches are not head-major")
            k_memory.append(km)
            v_memory.append(vm)
        self.num_blocks, self.block_size = kv_caches[0][0].shape[:2]
        self._no_rows = torch.empty(0, dtype=torch.int64)  # gather_rows when a step reads one run in place
        self.n_kv_heads = cfg.n_kv_heads
        eps = model.layers[0].input_norm.eps
        dims = (cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, self.block_size)
        scale = model.layers[0].attn.scale
        windowed = [layer.attn.window > 0 for layer in model.layers]
        self.window = max(layer.attn.window for layer in model.layers)  # one size (unavailable_reason)
        module = _Layers(
            packed,
            packed_lo,
            scales,
            scales_lo,
            kinds,
            groups,
            firsts,
            counts,
            norms,
            qk_norms,
            k_memory,
            v_memory,
            dims,
            eps,
            scale,
            sandwich,
            cfg.activation == "gelu_tanh",
            [bool(getattr(layer, "local_rope", False)) for layer in model.layers],
            windowed,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own; see the docstring
            self.script = torch.jit.script(module.eval())

    def accepts(self, meta: AttentionMetadata, num_rows: int) -> bool:
        """A decode-only step (one group of one-token rows, in order) whose rows all take the quantized kernels."""
        if len(meta.groups) != 1 or meta.window or (self.check is not None and self.check["verdict"] != "ok"):
            return False
        g = meta.groups[0]
        quantized = QUANTIZED_ROWS.get()
        return g.q_len == 1 and g.token_index.shape[0] == num_rows and quantized is not None and quantized >= num_rows

    def layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        local: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        eager: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager layer loop's (x, residual) for an accepted step; x (n, hidden) embeddings, cos/sin the
        step's (n, 1, D/2) RoPE tables, `local` the sliding-window layers' (the same ones where the model has no
        local RoPE); `eager()` runs the eager loop on the same step.  The first step runs both
        (the script first: the eager loop's K/V writes are the ones kept) and returns the eager result; they
        must be equal (and the script must run), or the script is not used again (`check`)."""
        if self.check is not None:
            return self._run(x, cos, sin, local, meta)
        try:
            out: tuple[torch.Tensor, torch.Tensor] | None = self._run(x, cos, sin, local, meta)
            detail = ""
        except Exception as e:  # noqa: BLE001 - a script the interpreter cannot run: the eager loop runs instead
            out, detail = None, f"the script failed: {type(e).__name__}: {e}"
        want = eager()
        if out is not None and not (want[1] is not None and all(map(torch.equal, out, want))):
            detail = f"max difference {float((out[0] - want[0]).abs().max()):.3g}"
        self.check = {"verdict": "mismatch" if detail else "ok", "rows": x.shape[0]}
        if detail:
            self.check["detail"] = detail
        return want  # type: ignore[return-value]

    def _run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        local: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Builds the step's rows, masks and full RoPE tables the way the eager kernels do (kept in the step's
        memo and on the tables, where the eager ops find them too), then calls the script."""
        g = meta.groups[0]
        nb, bs = self.num_blocks, self.block_size
        write_rows = head_major_write_rows(meta.slot_mapping, nb, bs, self.n_kv_heads, meta.memo)
        first = g.first_block
        gather_rows = self._no_rows if first >= 0 else head_major_gather_rows(g, self.n_kv_heads, nb)
        length = g.block_tables.shape[1] * bs
        cos_full, sin_signed = _full_tables(cos, sin)
        cos_local, sin_local = _full_tables(*local)
        bias = _mask_bias(g)
        bias_local = _mask_bias(with_sliding_window(meta, self.window).groups[0]) if self.window else bias
        return self.script(
            x, cos_full, sin_signed, cos_local, sin_local, write_rows, gather_rows, first, length, bias, bias_local
        )


def install(runner: Any) -> str | None:
    """Give `runner`'s model (a ModelRunner's) its scripted decode loop over the runner's KV caches where it
    applies; returns why not (None: installed)."""
    off = unavailable_reason(runner.model, runner.ops.name, runner.dtype, runner.device)
    if off is None:
        try:
            runner.model.scripted_decode = ScriptedDecode(runner.model, runner.kv_caches)
        except Exception as e:  # noqa: BLE001 - a torch without TorchScript, or one that cannot script it
            return f"off (TorchScript could not script the layer loop: {type(e).__name__}: {e})"
    return off


def describe(model: Any, device: torch.device, off: str | None) -> dict[str, Any]:
    """The runner's describe() keys: `scripted_decode` (on, or off and why) and, while on, the first step's
    check (pending, ok); nothing off the CPU.  `off`: what `install` returned."""
    if device.type != "cpu":
        return {}
    scripted = getattr(model, "scripted_decode", None)
    if scripted is None:
        return {"scripted_decode": off or "off"}
    check = scripted.check
    if check is not None and check["verdict"] != "ok":
        return {"scripted_decode": f"off (checked against the eager loop on its first step: {check.get('detail')})"}
    return {"scripted_decode": "on", "scripted_decode_check": check["verdict"] if check else "pending"}
