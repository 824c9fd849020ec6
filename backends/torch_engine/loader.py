"""Weights of a dense decoder (GGUF file or Hugging Face safetensors folder) into its family's model
(backends/torch_engine/models/: llama, qwen3, gemma3, phi3; `ARCHITECTURES` lists what runs).

The name mapping is data (backends.weight_map.names(architecture, format) maps a file's tensor name to the
model parameter and, for merged projections, which shard it fills: Q/K/V -> qkv_proj, gate/up -> gate_up_proj).
Per architecture (the family's GGUF_QK_REORDERED): whether llama.cpp's converter reordered the Q/K rows of a
GGUF for interleaved-pair RoPE.  The loader undoes that reorder, so the model always runs rotate-half RoPE, one
layout for GGUF and HF checkpoints alike (same perplexity either way; see NOTES.md).  A family's HF_NORM_OFFSET
is added to a Hugging Face checkpoint's norm weights (Gemma: HF stores w for a (1 + w) norm, GGUF 1 + w).

GGUF tensors are read from the file's mmap (offsets from backends.gguf_reader: no slow GGUFReader open) and
dequantized with gguf.quants.dequantize (F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K..Q6_K, ...).

Weight quantization happens while loading, tensor by tensor (`load_model`'s weight_quant), so neither host nor
device ever holds the dense model whole when the plan asked for a quantized one:
- "gguf": projection weights stored in a quantized GGUF type (weight_map.REPACK_KIND) are not dequantized to the
  compute dtype: their blocks are repacked (backends.torch_engine.gguf_repack) into hearth's int4 / int8 layout with
  group size 32 and the projection becomes a QuantLinear.  That keeps exactly the weights llama.cpp runs for
  Q4_0/Q4_1/Q4_K/Q8_0/Q5_0, and on CUDA for Q6_K too (kind "q6", its own 6.56 bits: native_q6); the others, and
  Q6_K on the CPU, are requantized to int8 per 32 within half a level (gguf_repack says why); 5 (int4) or 8.5
  (int8) bits each instead of 16.  A merged projection (Q/K/V, gate/up) stays
  quantized only when all its parts repack: one QuantLinear when they share a kind, else a SplitLinear whose parts
  keep their own kinds (Q4_K_M's Q4_K Q and K int4 beside its Q6_K V int8: gguf_repack.merge_kept,
  split_linear.py); otherwise that projection is dequantized like the rest.  An untied model also keeps its lm head
  (a QuantLinear) and its token embedding (a QuantEmbedding, quant_embedding.py: the step's rows gathered, then
  dequantized) as the file's repacked blocks, on every device; a tied one keeps the dense embedding, which the
  head reads whole every step.  weight_map.repacked_params and hwprobe.memory.torch_gguf_weights /
  torch_cpu_weights are the same rules for the planner's arithmetic.
- "int8" / "int4" / "fp8": each projection weight is quantized by round-to-nearest (quantize.quantize_rows,
  the same quantizer quantize_model uses, hence the same weights bit for bit) right after it is read and
  converted to the compute dtype, on the device the model will run on, a few MiB of rows at a time; only the
  quantized form is kept.  At most one dense projection is alive at any moment (a test counts them), so the
  device's peak is the quantized model plus one chunk's scratch.  Why on the device and not on the CPU: the
  int4 clip search runs at ~6 M weights/s on this 2-core CPU (a 13 B model would take 36 minutes), a GPU's
  memory bandwidth should make it seconds (not measured yet: no GPU here); and the dense chunk crosses PCIe
  once, as the dense weight would have.
- "int4+attn8" (quantize.MIXED): the same, per projection at its own kind (quantize.config_for): the attention
  projections int8, the MLP's int4.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from backends.errors import ConfigError, ModelFormatError, UnsupportedArchitectureError
from backends.modelspec import ModelSpec, TensorSpec
from backends.quant_config import packed_modules, spec_quant
from backends.torch_engine import quantize
from backends.torch_engine.gguf_repack import GGUF_BLOCKS, merge_kept
from backends.torch_engine.gptq_awq import INPUT_PERM
from backends.torch_engine.models import FAMILIES, family
from backends.torch_engine.models.layers import DecoderConfig, DecoderModel
from backends.torch_engine.quant_embedding import QuantEmbedding
from backends.torch_engine.quantize import (
    HEAD_DENSE_MIN_ROWS,
    QuantConfig,
    QuantLinear,
    layer_config,
    set_submodule,
)
from backends.torch_engine.split_linear import SplitLinear
from backends.torch_engine.tp.layers import read_plan as tp_read_plan
from backends.torch_engine.tp.layers import wrap_loaded_shares
from backends.torch_engine.weights import FREQ_FACTORS, ROPE_FACTOR_TENSORS, Selection, file_weights, unreorder
from backends.weight_map import SHARDS, is_projection_param, template
from backends.weight_map import names as weight_names
from kernels.dispatch import KernelSet
from kernels.quant_matmul import QuantWeight, dequantize
from kernels.rope import rope_inv_freq

if TYPE_CHECKING:  # pragma: no cover
    from backends.torch_engine.tp.comm import Comm


ARCHITECTURES = tuple(sorted(FAMILIES))

# read separately: Llama 3 frequency factors, Phi-3 LongRoPE's factors (short ones used: models/phi3.py)


def base_config(spec: ModelSpec) -> DecoderConfig:
    """The config every family starts from: the spec's shapes, RoPE, biases, QK-norm, window, tied head."""
    names = {t.name for t in spec.tensors}
    return DecoderConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        ffn_size=spec.ffn_size,
        rms_eps=spec.rms_eps,
        rope_base=spec.rope_base,
        rope_scaling=dict(spec.rope_scaling),
        qkv_bias=any(n.endswith(("attn_q.bias", "q_proj.bias")) for n in names),
        qk_norm=any(n.endswith(("attn_q_norm.weight", "self_attn.q_norm.weight")) for n in names),
        sliding_window=spec.sliding_window,
        tied_embeddings=spec.tied_embeddings,
    )


def config_from_spec(spec: ModelSpec) -> DecoderConfig:
    if spec.architecture not in FAMILIES or spec.n_experts:
        raise UnsupportedArchitectureError(
            f"the torch engine runs {', '.join(ARCHITECTURES)} models; {spec.name} is {spec.architecture}"
            + (f" with {spec.n_experts} experts" if spec.n_experts else ""),
            "use --backend llama.cpp for this model",
        )
    return family(spec.architecture).config(spec, base_config(spec))


def _text_model_name(name: str) -> str:
    """A multimodal checkpoint's text-model tensor under its text-only name: Hugging Face's
    Gemma3ForConditionalGeneration keeps "language_model.model.layers.0..." beside its vision tower, whose
    tensors then match no name of the map and are skipped."""
    return name.removeprefix("language_model.")


def _unreorder_any(w: torch.Tensor | QuantWeight, n_heads: int) -> torch.Tensor | QuantWeight:
    """unreorder for a dense weight, or for the rows of a quantized one (groups run along the inputs)."""
    if isinstance(w, torch.Tensor):
        return unreorder(w, n_heads)
    return w.map_rows(lambda t: unreorder(t, n_heads))


Kept = torch.Tensor | QuantWeight | list[QuantWeight]  # a parameter as read: a split projection is a list of parts


def _merge(parts: list[torch.Tensor | QuantWeight], dtype: torch.dtype) -> Kept:
    """Concatenate the shards of a merged projection along the outputs: quantized when every shard is
    (gguf_repack.merge_kept: one QuantWeight of one kind, or the parts at their own kinds, a SplitLinear's), else
    dense in `dtype` (quantized shards dequantized)."""
    if all(isinstance(p, QuantWeight) for p in parts):
        return merge_kept(parts)  # type: ignore[arg-type]
    dense = [p if isinstance(p, torch.Tensor) else dequantize(p).to(dtype) for p in parts]
    return torch.cat(dense, dim=0)


def check_file_shapes(spec: ModelSpec, cfg: DecoderConfig) -> None:
    """Every file tensor the model takes has the shape the config implies, checked from the header before a
    byte of weights is read (ModelSpec's checks cover GGUF metadata; this covers what the engine itself builds,
    for GGUF and HF folders alike), so a wrong file is one line, never a reshape traceback."""
    h, hd, vocab = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    rows = {
        "q": cfg.n_heads * hd,
        "k": cfg.n_kv_heads * hd,
        "v": cfg.n_kv_heads * hd,
        "gate": cfg.ffn_size,
        "up": cfg.ffn_size,
    }
    fixed = {
        "embed.weight": (vocab, h),
        "norm.weight": (h,),
        "lm_head.weight": (vocab, h),
        "input_norm.weight": (h,),
        "post_norm.weight": (h,),
        "attn.o_proj.weight": (h, cfg.n_heads * hd),
        "mlp.down_proj.weight": (h, cfg.ffn_size),
        "attn.q_norm.weight": (hd,),
        "attn.k_norm.weight": (hd,),
        "attn_post_norm.weight": (h,),
        "ffn_post_norm.weight": (h,),
        "attn.qkv_proj.weight": ((cfg.n_heads + 2 * cfg.n_kv_heads) * hd, h),  # fused (Phi-3)
        "mlp.gate_up_proj.weight": (2 * cfg.ffn_size, h),
    }
    names = weight_names(spec.architecture, spec.format)
    for t in (*spec.tensors, *_packed_as_weights(spec)):
        key, layer = template(_text_model_name(t.name))
        if key not in names:
            continue
        if layer is not None and layer >= cfg.n_layers:
            raise ModelFormatError(
                f"{spec.path}: tensor {t.name} belongs to layer {layer}, but the model has {cfg.n_layers} layers",
                "the file is damaged: download it again",
            )
        target, shard = names[key]
        if shard is not None:
            want: tuple[int, ...] = (rows[shard],) + ((h,) if target.endswith(".weight") else ())
        else:
            want = fixed[target.split(".", 2)[2] if target.startswith("layers.") else target]
        got = tuple(reversed(t.shape)) if spec.format == "gguf" else tuple(t.shape)  # as (out, in)
        if got != want:
            raise ModelFormatError(
                f"{spec.path}: tensor {t.name} is {list(got)} (out, in), but the "
                f"{spec.architecture} model its config describes needs {list(want)}",
                "the file is damaged or its config does not match its weights",
            )


def _packed_as_weights(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """A GPTQ / AWQ folder's packed modules as the (out, in) weights they stand for, so check_file_shapes checks
    them against the config like any weight (quant_config.packed_modules checked the packing itself)."""
    quant = spec_quant(spec.path, spec.metadata) if spec.format != "gguf" else None
    if quant is None:
        return ()
    return tuple(
        TensorSpec(m.prefix + ".weight", quant.label, (m.out_features, m.in_features), 0, 0)
        for m in packed_modules(quant, spec.tensors, spec.path)
    )


def _is_projection(key: str, names: dict[str, tuple[str, str | None]]) -> bool:
    """File names (templated) of the weights that are nn.Linear projections inside the blocks."""
    return is_projection_param(names.get(key, ("", None))[0])


def _quantize_on_load(weight: torch.Tensor, config: QuantConfig, device: torch.device) -> torch.Tensor | QuantWeight:
    """One projection (or shard of a merged one) quantized on `device`; dense when quantize.layer_config says
    the layer stays dense (int4 with in_features not a multiple of 32)."""
    layer_cfg = quantize.layer_config(config, weight.shape[1])
    return weight if layer_cfg is None else quantize.quantize_rows(weight, layer_cfg, device)


LOAD_QUANTS = ("none", "gguf", "int8", "int4", "fp8", quantize.MIXED)


def complete_params(model: DecoderModel, params: dict, spec: ModelSpec, what: str) -> set[str]:
    """Drop a tied head's own entry (it shares the embedding's weight), then check that `params` holds every
    parameter `model` has: a ModelFormatError naming the first missing one.  Returns the model's parameter names."""
    if model.cfg.tied_embeddings:
        params.pop("lm_head.weight", None)
    expected = {n for n, _ in model.named_parameters()}
    missing = expected - set(params)
    if missing:
        raise ModelFormatError(
            f"{spec.path} lacks {len(missing)} weights the {what} needs, e.g. {sorted(missing)[0]}",
            "the file is incomplete or not a supported model",
        )
    return expected


def load_model(
    spec: ModelSpec,
    ops: KernelSet,
    dtype: torch.dtype,
    device: torch.device,
    weight_quant: str = "none",
    host_layers: int = 0,
    n_ctx: int = 0,
    tp: Comm | None = None,
) -> DecoderModel:
    """Build the model and fill every parameter from the file; ModelFormatError if one is missing.
    tp: a tensor-parallel rank: the model is this rank's share, read as such (only its rows and columns leave
    the file, before dequantizing and before the copy to the device: tp/layers.ReadPlan), with its collectives.
    weight_quant (one of LOAD_QUANTS): "none" dense in `dtype`; "gguf" keeps a GGUF's quantized projection
    blocks (gguf_repack); "int8" / "int4" / "fp8" / "int4+attn8" quantize each projection as it is read (module
    docstring).
    host_layers: the first so many blocks will stream from host RAM (offload.py): their weights never stay on
    `device`, and the model is returned on the host for offload.offload_layers to place (a model that needs
    offload does not fit on the device whole, even for a moment).  n_ctx: the context the engine runs, which
    picks LongRoPE's long factors over the short ones when it passes the original context (models/phi3.py).

    Four steps, each its own function: the read plan (config, shape checks, a rank's share), reading and
    preparing the tensors (read_params), assembling the model from them (assemble), and a rank's wrappers."""
    if weight_quant not in LOAD_QUANTS:
        raise ConfigError(f"the loader's weight quantization is one of {', '.join(LOAD_QUANTS)}, got {weight_quant!r}")
    rtn = None if weight_quant in ("none", "gguf") else quantize.config_for(weight_quant)
    cfg, plan = read_plan(spec, weight_quant == "gguf", rtn, tp, native_q6(device))
    params, factors = read_params(spec, cfg, dtype, device, weight_quant == "gguf", rtn, host_layers, plan)
    model = assemble(spec, cfg, ops, params, factors, n_ctx, dtype)
    if plan is not None:
        wrap_loaded_shares(model, plan, tp)  # type: ignore[arg-type]
    return (model if host_layers else model.to(device)).eval()


def read_plan(
    spec: ModelSpec, keep_gguf_quant: bool, rtn: QuantConfig | None, tp: Comm | None, q6: bool = False
) -> tuple[Any, Any]:
    """(config, tensor-parallel read plan or None): the model's config from the spec, every file tensor's shape
    checked against it, and for a rank of a group the share it reads (the config then at the rank's widths).
    q6: Q6_K blocks load as kind "q6" (native_q6), whose input columns split on whole 256-weight blocks."""
    cfg = config_from_spec(spec)
    check_file_shapes(spec, cfg)
    if tp is None or tp.world <= 1:
        return cfg, None
    if spec.format != "gguf" and spec_quant(spec.path, spec.metadata) is not None:
        raise ConfigError(
            f"{spec.name} is a {spec.file_type} checkpoint, which the torch engine does not split over GPUs yet",
            "run it on one GPU (--tensor-parallel 1), or use a GGUF or 16-bit copy of the model",
        )
    names = weight_names(spec.architecture, spec.format)
    plan = tp_read_plan(cfg, tp.rank, tp.world, _down_group(spec, names, keep_gguf_quant, rtn, cfg.ffn_size, q6))
    return plan.local_config(cfg), plan  # the model is built at this rank's widths


def read_params(
    spec: ModelSpec,
    cfg: DecoderConfig,
    dtype: torch.dtype,
    device: torch.device,
    keep_gguf_quant: bool,
    rtn: QuantConfig | None,
    host_layers: int,
    plan: Any,
) -> tuple[dict[str, Kept], dict[str, torch.Tensor]]:
    """Every file tensor under its model parameter name, prepared: Q/K rows un-reordered, norms in float32,
    the rest in `dtype` or quantized (kept GGUF blocks, or `rtn` on `device`), merged projections merged (a list of
    parts where they keep different kinds: a SplitLinear).
    Returns (params, RoPE factor tensors as read)."""
    gguf = spec.format == "gguf"
    names = weight_names(spec.architecture, spec.format)
    fam = family(spec.architecture)
    prepare = _Prepare(
        cfg,
        dtype,
        device,
        rtn,
        host_layers,
        reorder=gguf and fam.GGUF_QK_REORDERED[spec.architecture],
        norm_offset=0.0 if gguf else getattr(fam, "HF_NORM_OFFSET", 0.0),
    )
    scale_dtype = torch.float32 if device.type == "cpu" else dtype  # CPU packing rounds the scales once itself
    keep = functools.partial(_keep_quantized, names, keep_gguf_quant, _quantized_ends(keep_gguf_quant, cfg))
    select = functools.partial(_select, plan, names)
    q6 = native_q6(device)
    params: dict[str, Kept] = {}
    shards: dict[str, dict[int, torch.Tensor | QuantWeight]] = {}
    factors: dict[str, torch.Tensor] = {}  # rope_freqs / rope_factors_short / rope_factors_long, as read
    perms: dict[str, dict[int, torch.Tensor]] = {}  # GPTQ act-order input orders, as shards are
    for name, tensor in file_weights(spec, keep, scale_dtype, dtype, select, q6):
        if name in ROPE_FACTOR_TENSORS:
            factors[name] = tensor.reshape(-1)
            continue
        if name.endswith(INPUT_PERM):
            key, layer = template(_text_model_name(name.removesuffix(INPUT_PERM) + ".weight"))
            if key in names:
                target, shard = names[key]
                perms.setdefault(target.format(i=layer), {})[SHARDS.get(shard or "", 0)] = tensor
            continue
        key, layer = template(_text_model_name(name))
        if key not in names:
            continue  # e.g. HF rotary inv_freq buffers
        target, shard = names[key]
        target = target.format(i=layer)
        tensor = prepare(tensor, target, shard, layer)
        if shard is None:
            params[target] = tensor
        else:
            shards.setdefault(target, {})[SHARDS[shard]] = tensor
    counts = {target: len(parts) for target, parts in shards.items()}
    for target in list(shards):  # popped as merged: a merged copy never lives beside every layer's parts
        parts = shards.pop(target)
        params[target] = _merge([parts.pop(i) for i in sorted(parts)], dtype)
    params.update(_input_perms(spec, perms, counts))
    return params, factors


def _input_perms(
    spec: ModelSpec, perms: dict[str, dict[int, torch.Tensor]], shard_counts: dict[str, int]
) -> dict[str, torch.Tensor]:
    """{module + INPUT_PERM: input order} of the act-order projections (QuantLinear's input_perm).  The shards
    of a merged projection read the same input, so they must share one order (GPTQ quantizes Q, K and V from the
    same inputs, hence the same order); a checkpoint where they differ is refused, not run wrong."""
    out = {}
    for target, parts in perms.items():
        orders = [parts.get(i) for i in range(shard_counts.get(target, 1))]
        first = orders[0]
        if first is None or any(p is None or not torch.equal(p, first) for p in orders):
            raise ModelFormatError(
                f"{spec.path}: the act-order input orders (g_idx) of the parts of {target} differ",
                "hearth runs act-order checkpoints whose Q/K/V and gate/up share one order: use another quantization",
            )
        out[target.removesuffix(".weight") + INPUT_PERM] = first
    return out


def _select(plan: Any, names: dict[str, tuple[str, str | None]], name: str) -> Selection:
    """A tensor-parallel rank's rows and columns of file tensor `name` (tp/layers.ReadPlan); without a plan, or
    for a tensor the model does not take, the whole tensor."""
    key, layer = template(_text_model_name(name))
    if plan is None or key not in names:
        return None, None
    target, shard = names[key]
    return plan.select(target.format(i=layer), shard)


def native_q6(device: torch.device) -> bool:
    """Whether kept Q6_K blocks load as they are (kind "q6", gguf_q6.py: 6.5625 bits, the file's weights) rather
    than requantized to int8 (8.5 bits): on CUDA, where kernels/q6_gemv_triton.py and q6_matmul_triton.py read
    them; the CPU's kernels read no q6, so there int8 (gguf_repack.py).  Offloaded blocks (offload.py) stream to
    the GPU and run there: q6 too.  hwprobe.memory prices the same (GGUF_Q6_BYTES on a GPU)."""
    return device.type == "cuda"


_ENDS = ("output.weight", "token_embd.weight")  # the GGUF names of an untied lm head and the token embedding


def _quantized_ends(keep_gguf_quant: bool, cfg: DecoderConfig) -> bool:
    """Whether a GGUF's untied lm head and token embedding keep their quantized blocks too, on every device: the
    head a QuantLinear (a decode step reads it whole: Llama 3's Q6_K head as int8 is 558 MB a step where bf16 is
    1050), the embedding a QuantEmbedding (quant_embedding.py: 1 GiB of bf16 rows for Llama 3, of which a step
    reads a few).  A tied head stays the dense embedding (bf16, held once for both), for every row: measured on
    the starter (Q8_0 embedding, 49152 x 576), the int4 kernel's two halves cost 0.97 / 1.47 / 5.9 ms at
    1 / 4 / 16 rows against the dense matmul's 1.71 / 1.79 / 2.59 (torch's int4 kernel re-reads the weight every
    4 rows), and the dense head is the more accurate one (mean |error| 0.029 vs 0.045 against the file's exact
    Q8_0 logits; top-1 0.961 vs 0.945) and gives a row the same bits at any row count, prompt rows included.
    On the CPU's bf16 path the runner then gives decode rows an int8 copy of it (cpu_head.py: fbgemm's int8
    dot products, 1.1-1.3 vs 7-11 ms of CPU a call on the loaded Zen 4); prompt rows keep this dense one."""
    return keep_gguf_quant and not cfg.tied_embeddings


def _keep_quantized(
    names: dict[str, tuple[str, str | None]], keep_gguf_quant: bool, quant_ends: bool, name: str, qtype: object
) -> bool:
    """Whether GGUF tensor `name` keeps its quantized blocks (gguf_weights' `keep`): the block projections
    when the GGUF's quantization is kept, and an untied model's head and embedding (_quantized_ends)."""
    return (keep_gguf_quant and _is_projection(template(name)[0], names)) or (quant_ends and name in _ENDS)


@dataclasses.dataclass(frozen=True)
class _Prepare:
    """How read_params prepares each file tensor it keeps (called once per tensor)."""

    cfg: DecoderConfig
    dtype: torch.dtype
    device: torch.device
    rtn: QuantConfig | None  # round-to-nearest quantization of the projections, on `device`
    host_layers: int  # blocks whose quantized projections are kept on the host (offload.py)
    reorder: bool  # a GGUF whose Q/K rows llama.cpp's converter reordered (the family's GGUF_QK_REORDERED)
    norm_offset: float  # added to norm weights: a family's HF_NORM_OFFSET for a Hugging Face checkpoint

    def __call__(
        self, tensor: torch.Tensor | QuantWeight, target: str, shard: str | None, layer: int | None
    ) -> torch.Tensor | QuantWeight:
        if self.reorder and shard in ("q", "k"):
            tensor = _unreorder_any(tensor, self.cfg.n_heads if shard == "q" else self.cfg.n_kv_heads)
        if not isinstance(tensor, torch.Tensor):
            if target == "embed.weight" and tensor.kind not in QuantEmbedding.KINDS:  # no gather for that layout
                return dequantize(tensor).to(self.dtype)
            if target == "embed.weight" and tensor.kind != "q6":  # scales in the compute dtype (q6's are the file's)
                offsets = None if tensor.offsets is None else tensor.offsets.to(self.dtype)
                tensor = dataclasses.replace(tensor, scales=tensor.scales.to(self.dtype), offsets=offsets)
            return tensor
        # RMSNorm weights stay float32: the norm runs in float32 anyway (as llama.cpp's does), and a bf16
        # weight would be converted again in every layer of every step
        tensor = tensor.float() + self.norm_offset if target.endswith("norm.weight") else tensor.to(self.dtype)
        if self.rtn is not None and is_projection_param(target):
            tensor = _quantize_on_load(tensor, self.rtn.for_module(target.removesuffix(".weight")), self.device)
            if layer is not None and layer < self.host_layers:  # quantized on the device, kept on the host
                tensor = tensor.to("cpu")
        return tensor


def assemble(
    spec: ModelSpec,
    cfg: DecoderConfig,
    ops: KernelSet,
    params: dict[str, Kept],
    factors: dict[str, torch.Tensor],
    n_ctx: int,
    dtype: torch.dtype,
) -> DecoderModel:
    """The family's model built on the meta device and given `params` (no copy): dense ones assigned, quantized
    projections as QuantLinear modules (SplitLinear where a merged one's parts keep different kinds), a kept
    embedding as a QuantEmbedding, a tied head sharing the embedding; then its RoPE frequencies."""
    with torch.device("meta"):
        model = family(spec.architecture).MODEL(cfg, ops)
    complete_params(model, params, spec, f"{spec.architecture} model")
    quantized = {k: v for k, v in params.items() if not isinstance(v, torch.Tensor)}
    model.load_state_dict({k: v for k, v in params.items() if k not in quantized}, strict=False, assign=True)
    for target, qw in quantized.items():
        module = target.removesuffix(".weight")
        if module == "embed":
            model.embed = QuantEmbedding(qw, dtype)  # type: ignore[arg-type]
            continue
        bias = params.get(module + ".bias")
        perm = params.get(module + INPUT_PERM)
        set_submodule(model, module, quant_module(qw, bias if isinstance(bias, torch.Tensor) else None, perm))  # type: ignore[arg-type]
    if isinstance(model.lm_head, QuantLinear):
        model.lm_head.dense_min_rows = HEAD_DENSE_MIN_ROWS
    if cfg.tied_embeddings and isinstance(model.lm_head, nn.Linear):
        model.lm_head.weight = model.embed.weight
    set_rope(model, cfg, factors, n_ctx)
    return model


def quant_module(
    weight: QuantWeight | list[QuantWeight], bias: torch.Tensor | None, input_perm: torch.Tensor | None
) -> nn.Module:
    """A quantized projection's module: a QuantLinear, or for the parts of a merged projection that keep different
    kinds a SplitLinear of one QuantLinear each (the bias cut at the parts' rows; an input order serves all)."""
    if isinstance(weight, QuantWeight):
        return QuantLinear(weight, bias, input_perm=input_perm)
    widths = [w.out_features for w in weight]
    biases = [None] * len(weight) if bias is None else [b.clone() for b in bias.split(widths)]
    return SplitLinear([QuantLinear(w, b, input_perm=input_perm) for w, b in zip(weight, biases)])


def set_rope(model: DecoderModel, cfg: DecoderConfig, factors: dict[str, torch.Tensor], n_ctx: int) -> None:
    """model.inv_freq (and inv_freq_local) from the config's RoPE and the file's factor tensors."""
    use_long = 0 < cfg.rope_original_ctx < n_ctx  # LongRoPE: llama.cpp's rule (models/phi3.py)
    freq_factors = factors.get(
        FREQ_FACTORS, factors.get("rope_factors_long.weight" if use_long else "rope_factors_short.weight")
    )
    listed = cfg.rope_factors_long if use_long and cfg.rope_factors_long else cfg.rope_factors
    if freq_factors is None and listed:
        freq_factors = torch.tensor(listed, dtype=torch.float32)
    scaling = dict(cfg.rope_scaling)
    scaling.pop("rope_freqs_tensor", None)
    if freq_factors is not None:
        scaling = {}
    rot = cfg.rope_dim if 0 < cfg.rope_dim < cfg.head_dim else cfg.head_dim
    model.inv_freq = rope_inv_freq(rot, cfg.rope_base, scaling, freq_factors)
    if cfg.rope_base_local:  # sliding-window layers' own RoPE (Gemma 3): their base, no scaling
        model.inv_freq_local = rope_inv_freq(rot, cfg.rope_base_local)


def _down_group(
    spec: ModelSpec, names: dict, keep_gguf: bool, rtn: QuantConfig | None, ffn: int, q6: bool = False
) -> int:
    """The quantization group of down_proj's inputs as the loader will hold it (its FFN split falls on whole
    groups, as tp/layers.shard_model's does): a kept GGUF block (32; 256 where any layer's is Q6_K kept as q6:
    QuantWeight.column_unit), an int4 group, else 1 (dense, or int8 / fp8 per channel, quantized from the rank's
    own columns)."""
    if rtn is not None:
        layer = layer_config(rtn.for_module("layers.0.mlp.down_proj"), ffn)
        return layer.group_size if layer is not None and layer.kind == "int4" else 1
    if keep_gguf and spec.format == "gguf":
        downs = [
            t.ggml_type
            for t in spec.tensors
            if names.get(template(_text_model_name(t.name))[0], ("", None))[0].endswith("mlp.down_proj.weight")
        ]
        if downs and downs[0] in GGUF_BLOCKS:
            return 256 if q6 and "Q6_K" in downs else 32
    return 1
