"""Tiny random Llama-shaped GPTQ and AWQ safetensors folders, packed here from the formats' specification (no
reference packer installs on these CPU machines: AutoAWQ and GPTQModel ship as sdists that build CUDA
extensions), with the same tensor names, shapes and dtypes as published checkpoints (e.g. TheBloke's
*-GPTQ / *-AWQ repositories: model.layers.N.self_attn.q_proj.qweight I32, .qzeros I32, .scales F16, .g_idx I32).

The packing, written from AutoGPTQ's QuantLinear.pack and AutoAWQ's WQLinear_GEMM.from_linear (read, not
copied): w = scale * (q - zero) per group of inputs; GPTQ packs q along the inputs (32 / bits values per int32,
lowest bits first), zero points along the outputs the same way, stored minus one in the classic "gptq" format;
AWQ packs both along the outputs, nibble i of a word holding column AWQ_ORDER[i] of its eight.

`write_quantized(folder, variant)` also returns the exact dense weights the checkpoint stands for, which
`write_dense` writes as a float32 folder: the reference the engine's logits are held to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# which projections read the same input (so share an act-order permutation, as GPTQ's do)
INPUTS = {"q_proj": "attn_in", "k_proj": "attn_in", "v_proj": "attn_in", "o_proj": "o_in"}
INPUTS.update({"gate_proj": "mlp_in", "up_proj": "mlp_in", "down_proj": "down_in"})


@dataclass(frozen=True)
class Variant:
    method: str = "gptq"  # "gptq" | "awq"
    bits: int = 4
    group_size: int = 32  # -1: per output channel
    sym: bool = False
    act_order: bool = False
    checkpoint_format: str = "gptq"  # "gptq" (zeros stored minus one) | "gptq_v2"

    def config(self) -> dict:
        if self.method == "awq":
            return {
                "quant_method": "awq",
                "bits": 4,
                "group_size": self.group_size,
                "version": "gemm",
                "zero_point": True,
            }
        return {
            "quant_method": "gptq",
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.act_order,
            "sym": self.sym,
            "damp_percent": 0.01,
            "true_sequential": True,
            "checkpoint_format": self.checkpoint_format,
        }


def dense_weights(seed: int = 0, cfg: dict = CONFIG) -> dict[str, torch.Tensor]:
    """Random float32 weights under Hugging Face Llama names."""
    g = torch.Generator().manual_seed(seed)
    h, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd

    def rnd(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    sd = {
        "model.embed_tokens.weight": rnd(cfg["vocab_size"], h, scale=1.0),
        "model.norm.weight": 1 + rnd(h, scale=0.1),
        "lm_head.weight": rnd(cfg["vocab_size"], h, scale=0.2),
    }
    shapes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h)}
    shapes.update({"gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)})
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + rnd(h, scale=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + rnd(h, scale=0.1)
        for name, shape in shapes.items():
            part = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            sd[f"{p}{part}.{name}.weight"] = rnd(*shape)
    return sd


def quantize_groups(w: torch.Tensor, group: int, bits: int, sym: bool, zero_min: int = 0):
    """Round-to-nearest per contiguous group of inputs: (N, K) float -> q (N, K) int64 in 0..2^bits-1, scales
    (N, G) float16, zero points (N, G) int64 in zero_min..2^bits-1.  GPTQ's own search differs (it corrects the
    error it makes), but the packing only cares about the integers."""
    n, k = w.shape
    maxq = (1 << bits) - 1
    wg = w.float().reshape(n, k // group, group)
    if sym:
        scales = (wg.abs().amax(-1) * 2 / maxq).clamp(min=1e-6).half()
        zeros = torch.full(scales.shape, (maxq + 1) // 2, dtype=torch.int64)
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        scales = ((hi - lo) / maxq).clamp(min=1e-6).half()
        zeros = torch.round(-lo / scales.float()).to(torch.int64).clamp(zero_min, maxq)
    q = torch.round(wg / scales.float()[..., None]) + zeros[..., None]
    return q.clamp(0, maxq).to(torch.int64).reshape(n, k), scales, zeros


def dequant(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """The weights a GPTQ / AWQ kernel computes: scale[g] * (q - zero[g]) with g = g_idx[k]; float32, exact."""
    return scales.float()[:, g_idx] * (q - zeros[:, g_idx]).float()


def _words(values: torch.Tensor, bits: int) -> torch.Tensor:
    """(..., M) integers in 0..2^bits-1 -> (..., M * bits / 32) int32, value i of each run in bits i * bits up."""
    per = 32 // bits
    v = values.to(torch.int64).reshape(*values.shape[:-1], -1, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    packed = (v << shifts).sum(-1)  # disjoint bits: the sum is the OR
    return torch.from_numpy(packed.numpy().astype(np.uint32).view(np.int32))


def pack_gptq(q, scales, zeros, g_idx, bits: int, checkpoint_format: str) -> dict[str, torch.Tensor]:
    """q (N, K), scales / zeros (N, G), g_idx (K,) -> GPTQ's qweight (K*bits/32, N), qzeros (G, N*bits/32),
    scales (G, N) float16, g_idx (K,) int32."""
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    stored = stored & ((1 << bits) - 1)  # a zero point of 0 stored minus one: AutoGPTQ's wrap (its kernels read 16)
    return {
        "qweight": _words(q, bits).t().contiguous(),
        "qzeros": _words(stored.t().contiguous(), bits),
        "scales": scales.t().contiguous().half(),
        "g_idx": g_idx.to(torch.int32),
    }


def pack_awq(q, scales, zeros) -> dict[str, torch.Tensor]:
    """q (N, K), scales / zeros (N, G) -> AWQ GEMM's qweight (K, N/8), qzeros (G, N/8), scales (G, N) float16."""
    order = torch.tensor(AWQ_ORDER)

    def shuffled(t: torch.Tensor) -> torch.Tensor:  # (R, N): columns of each 8 into nibble order
        return t.reshape(t.shape[0], -1, 8)[:, :, order].reshape(t.shape[0], -1)

    return {
        "qweight": _words(shuffled(q.t().contiguous()), 4),
        "qzeros": _words(shuffled(zeros.t().contiguous()), 4),
        "scales": scales.t().contiguous().half(),
    }


def quantize_checkpoint(sd: dict[str, torch.Tensor], v: Variant, seed: int = 1):
    """(the checkpoint's tensors, the dense float32 weights it stands for)."""
    g = torch.Generator().manual_seed(seed)
    perms: dict[tuple[str, str], torch.Tensor] = {}
    out, ref = {}, {}
    for name, w in sd.items():
        module = name.removesuffix(".weight")
        kind = module.rsplit(".", 1)[-1]
        if kind not in INPUTS:
            out[name] = ref[name] = w
            continue
        n, k = w.shape
        group = k if v.group_size == -1 else v.group_size
        layer = name.split(".")[2]
        perm = torch.arange(k)
        if v.act_order:
            perm = perms.setdefault((layer, INPUTS[kind]), torch.randperm(k, generator=g))
        qp, scales, zeros = quantize_groups(w[:, perm], group, v.bits, v.sym, zero_min=0)
        q = torch.empty_like(qp)
        q[:, perm] = qp
        g_idx = torch.empty(k, dtype=torch.int64)
        g_idx[perm] = torch.arange(k) // group
        ref[name] = dequant(q, scales, zeros, g_idx)
        packed = (
            pack_awq(q, scales, zeros)
            if v.method == "awq"
            else pack_gptq(q, scales, zeros, g_idx, v.bits, v.checkpoint_format)
        )
        out.update({f"{module}.{part}": t for part, t in packed.items()})
    return out, ref


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_quantized(folder: Path, v: Variant, seed: int = 0, side_file: bool = False):
    """A GPTQ / AWQ folder of a random tiny Llama; returns (folder, the dense float32 weights it stands for).
    side_file: the config in quantize_config.json (AutoGPTQ's place) instead of config.json."""
    return write_checkpoint(folder, dense_weights(seed), CONFIG, v, seed + 1, side_file)


def write_checkpoint(
    folder: Path, sd: dict[str, torch.Tensor], model_config: dict, v: Variant, seed: int = 1, side_file: bool = False
):
    """A GPTQ / AWQ folder of any Llama-named float state dict `sd` (config.json: `model_config`), its other
    tensors in float16 as published checkpoints keep them; returns (folder, the dense float32 weights it stands
    for)."""
    tensors, ref = quantize_checkpoint(sd, v, seed)
    config = dict(model_config) if side_file else {**model_config, "quantization_config": v.config()}
    _write(
        folder,
        {k: t.half() if t.is_floating_point() and k.endswith(".weight") else t for k, t in tensors.items()},
        config,
    )
    if side_file:
        (folder / "quantize_config.json").write_text(json.dumps(v.config()))
    return folder, {k: (t.half().float() if not k.endswith(("proj.weight",)) else t) for k, t in ref.items()}


def write_dense(folder: Path, weights: dict[str, torch.Tensor], config: dict = CONFIG) -> Path:
    """A float32 folder of the same model (the reference)."""
    return _write(folder, {k: t.float() for k, t in weights.items()}, dict(config))


def write_byte_tokenizer(folder: Path) -> Path:
    """A tokenizer.json for the tiny vocabulary of 256: one token per byte (byte-level BPE without merges), so
    the folder runs through the commands (`hearth ppl`, `run`) that tokenize text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"
