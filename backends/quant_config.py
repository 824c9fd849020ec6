"""The quantization of a GPTQ or AWQ safetensors folder: its config read and checked, and its packed tensors'
names, dtypes and shapes checked against it, from the headers alone (no torch: hf_folder calls this while it
builds the ModelSpec, so `hearth show` on a bad folder is one line and costs no weights read).

Where the config lives: `quantization_config` in config.json (transformers, optimum, vLLM), else
quantize_config.json (AutoGPTQ, GPTQModel) or quant_config.json (AutoAWQ).  What runs (the torch engine maps
the packed integers onto its own int4 / int8 layouts: backends/torch_engine/gptq_awq.py, where the packing
itself is written down):

- GPTQ: bits 4 (int4), or 8 when symmetric (int8); any group size dividing the input width, or -1 (one group
  per output channel); sym or not; desc_act ("act-order") with its g_idx; checkpoint_format "gptq" (zeros
  stored minus one, AutoGPTQ's quirk) or "gptq_v2" (zeros as they are).
- AWQ: version "gemm", 4 bits, zero points, any group size dividing the input width.

Refused with a one-line ModelFormatError naming the variant: GPTQ 2/3-bit, Marlin / BitBLAS / other repacked
checkpoint formats, GPTQModel's per-module overrides, AWQ GEMV / Marlin / exllama / IPEX packings, AWQ
without zero points, EXL2 folders and any other quant_method.  A config with wrong types or absurd numbers is
hostile input: the same one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from backends.errors import ModelFormatError
from backends.model_limits import HINT

GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint format -> what to add to a stored zero point
MAX_GROUP = 1 << 16  # a group size above this is no real checkpoint's (they use 32 to 128, or -1)
PACKED = ("qweight", "qzeros", "scales")  # the tensors every quantized module has
SCALE_DTYPES = ("F16", "BF16", "F32")
EXL2_SUFFIXES = (".q_weight", ".q_scale", ".q_groups", ".q_invperm")


@dataclass(frozen=True)
class CheckpointQuant:
    """What a GPTQ / AWQ folder's config says about its packed weights."""

    method: str  # "gptq" | "awq"
    bits: int  # 4, or 8 (GPTQ only)
    group_size: int  # input features per scale and zero point; -1 = one group per output channel
    sym: bool  # GPTQ's symmetric flag (informational: the stored zero points are what counts)
    desc_act: bool  # GPTQ act-order: input channels quantized in a permuted order (g_idx says which group)
    zero_add: int  # added to each stored zero point: 1 for GPTQ's classic format, 0 for gptq_v2 and AWQ

    @property
    def label(self) -> str:
        """The format as hearth names it (ModelSpec.file_type, `hearth show`, the plan): "GPTQ-4bit-g128",
        "AWQ-4bit-g128", "GPTQ-8bit-perchannel", with "-actorder" for act-order GPTQ."""
        group = "perchannel" if self.group_size == -1 else f"g{self.group_size}"
        return f"{self.method.upper()}-{self.bits}bit-{group}" + ("-actorder" if self.desc_act else "")

    def group_for(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


class _Tensor(Protocol):  # backends.spec_types.TensorSpec (not imported: spec_types imports weight_map only)
    name: str
    ggml_type: str
    shape: tuple[int, ...]


def _bad(where: str, what: str) -> ModelFormatError:
    return ModelFormatError(f"{where}: {what}", HINT)


def _unsupported(where: str, variant: str) -> ModelFormatError:
    return ModelFormatError(
        f"{where}: {variant} checkpoints are not supported",
        "hearth runs GPTQ 4-bit (and symmetric 8-bit) and AWQ GEMM 4-bit folders: use one of those, or a GGUF",
    )


def _get(cfg: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> tuple[str, Any]:
    """The first of `keys` present in `cfg` (AutoAWQ's quant_config.json says w_bit / q_group_size)."""
    for key in keys:
        if key in cfg:
            return key, cfg[key]
    return keys[0], default


def _int_field(cfg: dict[str, Any], keys: tuple[str, ...], where: str, default: int | None = None) -> int:
    key, value = _get(cfg, keys, default)
    if value is None:
        raise _bad(where, f"quantization config lacks {key}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(where, f"quantization {key} is {str(value)[:40]!r}, expected an integer")
    return value


def _bool_field(cfg: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(where, f"quantization {key} is {str(value)[:40]!r}, expected true or false")
    return value


def _str_field(cfg: dict[str, Any], keys: tuple[str, ...], where: str, default: str) -> str:
    key, value = _get(cfg, keys, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _bad(where, f"quantization {key} is {str(value)[:40]!r}, expected a string")
    return value.lower()


def _group_size(cfg: dict[str, Any], where: str) -> int:
    g = _int_field(cfg, ("group_size", "q_group_size"), where, -1)
    if g != -1 and not (2 <= g <= MAX_GROUP and g % 2 == 0):
        raise _bad(
            where, f"quantization group_size is {g}, expected -1 (per channel) or an even size up to {MAX_GROUP}"
        )
    return g


def parse_quant_config(cfg: Any, where: str) -> CheckpointQuant:
    """A GPTQ or AWQ quantization config (a dict as read from JSON) -> CheckpointQuant, or a one-line
    ModelFormatError naming the key or the unsupported variant."""
    if not isinstance(cfg, dict):
        raise _bad(where, f"the quantization config is a JSON {type(cfg).__name__}, expected an object")
    method = _str_field(cfg, ("quant_method",), where, "")
    if not method:  # quantize_config.json (AutoGPTQ) names no method; quant_config.json (AutoAWQ) says version
        method = "awq" if "version" in cfg or "w_bit" in cfg else "gptq"
    if method == "gptq":
        return _gptq(cfg, where)
    if method == "awq":
        return _awq(cfg, where)
    name = {"exl2": "EXL2 (ExLlamaV2)", "exl3": "EXL3 (ExLlamaV3)"}.get(method, f"quant_method {method[:40]!r}")
    raise _unsupported(where, name)


def _gptq(cfg: dict[str, Any], where: str) -> CheckpointQuant:
    bits = _int_field(cfg, ("bits",), where)
    if bits not in (2, 3, 4, 8):
        raise _bad(where, f"GPTQ bits is {bits}, expected 2, 3, 4 or 8")
    if bits in (2, 3):
        raise _unsupported(where, f"GPTQ {bits}-bit")
    fmt = _str_field(cfg, ("checkpoint_format", "format"), where, "gptq")
    if _bool_field(cfg, "is_marlin_format", where, False):
        fmt = "marlin"
    if fmt not in GPTQ_FORMATS:
        raise _unsupported(where, f"GPTQ checkpoint_format {fmt[:40]!r}")
    pack = _str_field(cfg, ("pack_dtype",), where, "int32")
    if pack != "int32":
        raise _unsupported(where, f"GPTQ pack_dtype {pack[:40]!r}")
    dynamic = cfg.get("dynamic") or {}
    if not isinstance(dynamic, dict) or any(not (isinstance(k, str) and k.startswith("-:")) for k in dynamic):
        raise _unsupported(where, "GPTQModel per-module overrides (dynamic)")
    sym = _bool_field(cfg, "sym", where, True)
    return CheckpointQuant(
        method="gptq",
        bits=bits,
        group_size=_group_size(cfg, where),
        sym=sym,
        desc_act=_bool_field(cfg, "desc_act", where, False),
        zero_add=GPTQ_FORMATS[fmt],
    )


def _awq(cfg: dict[str, Any], where: str) -> CheckpointQuant:
    version = _str_field(cfg, ("version",), where, "gemm")
    if version != "gemm":
        raise _unsupported(where, f"AWQ version {version[:40]!r}")
    bits = _int_field(cfg, ("bits", "w_bit"), where)
    if bits != 4:
        raise _unsupported(where, f"AWQ {bits}-bit")
    if not _bool_field(cfg, "zero_point", where, True):
        raise _unsupported(where, "AWQ without zero points (zero_point false)")
    return CheckpointQuant("awq", 4, _group_size(cfg, where), False, False, 0)


def find_quant_config(config: dict[str, Any], side_files: dict[str, Any], where: str) -> CheckpointQuant | None:
    """The folder's quantization, or None for a plain 16-bit folder: config.json's quantization_config first,
    else a side file's (`side_files`: {file name: its parsed JSON} of quantize_config.json / quant_config.json)."""
    if "quantization_config" in config and config["quantization_config"] is not None:
        return parse_quant_config(config["quantization_config"], f"{where} quantization_config")
    for name, cfg in side_files.items():
        return parse_quant_config(cfg, name)
    return None


@dataclass(frozen=True)
class PackedModule:
    """One quantized Linear of the checkpoint as its headers say: `prefix` (e.g.
    "model.layers.0.self_attn.q_proj"), and its logical (out_features, in_features)."""

    prefix: str
    out_features: int
    in_features: int
    has_g_idx: bool


def packed_modules(quant: CheckpointQuant, tensors: Iterable[_Tensor], where: str) -> tuple[PackedModule, ...]:
    """Every quantized module of the checkpoint, its packed tensors' dtypes and shapes checked against each other
    and against `quant` (one line naming the tensor otherwise).  Shapes per module (K inputs, N outputs, G groups):

    GPTQ: qweight int32 (K * bits / 32, N); qzeros int32 (G, N * bits / 32); scales (G, N); g_idx int32 (K,).
    AWQ:  qweight int32 (K, N / 8);         qzeros int32 (G, N / 8);         scales (G, N)."""
    by_name = {t.name: t for t in tensors}
    for name in by_name:
        if name.endswith(EXL2_SUFFIXES):
            raise _unsupported(where, "EXL2 (ExLlamaV2)")
    prefixes = sorted(n.removesuffix(".qweight") for n in by_name if n.endswith(".qweight"))
    if not prefixes:
        raise _bad(where, f"the config says {quant.label} but no tensor is named *.qweight")
    return tuple(_module(quant, p, by_name, where) for p in prefixes)


def _module(quant: CheckpointQuant, prefix: str, by_name: dict[str, _Tensor], where: str) -> PackedModule:
    parts = {}
    for part in PACKED:
        t = by_name.get(f"{prefix}.{part}")
        if t is None:
            raise _bad(where, f"{prefix} has a qweight but no {part}")
        want = SCALE_DTYPES if part == "scales" else ("I32",)
        if t.ggml_type not in want or len(t.shape) != 2:
            raise _bad(where, f"{prefix}.{part} is {t.ggml_type} {list(t.shape)}, expected 2-D {'/'.join(want)}")
        parts[part] = t.shape
    per_int = 32 // quant.bits
    rows, cols = parts["qweight"]
    # the qweight's shape gives the weight's (out, in); every other tensor is checked against it
    n, k = (cols, rows * per_int) if quant.method == "gptq" else (cols * per_int, rows)
    g = quant.group_for(k)
    if k % g or k == 0 or n == 0:
        raise _bad(where, f"{prefix} has {k} inputs: not a whole number of groups of {g}")
    if n % per_int:
        raise _bad(where, f"{prefix} has {n} outputs: its zero points do not fill whole int32 words of {per_int}")
    expect = {"qzeros": (k // g, n // per_int), "scales": (k // g, n)}
    for part, shape in expect.items():
        if tuple(parts[part]) != shape:
            raise _bad(
                where,
                f"{prefix}.{part} is {list(parts[part])}, but {quant.label} of {n}x{k} weights needs {list(shape)}",
            )
    g_idx = by_name.get(f"{prefix}.g_idx")
    if g_idx is not None and (g_idx.ggml_type != "I32" or tuple(g_idx.shape) != (k,)):
        raise _bad(where, f"{prefix}.g_idx is {g_idx.ggml_type} {list(g_idx.shape)}, expected I32 [{k}]")
    if quant.desc_act and g_idx is None:
        raise _bad(where, f"{prefix} has no g_idx, which act-order (desc_act) checkpoints need")
    return PackedModule(prefix, n, k, g_idx is not None)


def logical_params(quant: CheckpointQuant, tensors: Iterable[_Tensor]) -> int:
    """Parameters the checkpoint stands for: a packed int32 holds 32 / bits weights; scales, zero points and g_idx
    are no parameters of the model (so bits per weight = file bytes * 8 / this, ~4.2 for 4-bit g128)."""
    total = 0
    for t in tensors:
        n = 1
        for d in t.shape:
            n *= d
        if t.name.endswith(".qweight"):
            total += n * (32 // quant.bits)
        elif not t.name.endswith((".qzeros", ".scales", ".g_idx")):
            total += n
    return total


REGROUP_SIZES = (128, 64, 32)  # a per-channel int4 weight is re-expressed in the first of these dividing K (gptq_awq)
# projections that read the same input share one act-order permutation once merged (loader._input_perms)
_SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def loaded_group(quant: CheckpointQuant, in_features: int) -> int:
    """Input features per scale as the engine holds a module (gptq_awq._int4): per-channel int4 is regrouped."""
    group = quant.group_for(in_features)
    if quant.bits == 4 and group == in_features:
        return next((g for g in REGROUP_SIZES if in_features % g == 0), group)
    return group


def planner_extra(
    quant: CheckpointQuant, modules: Iterable[PackedModule], n_layers: int, layer_of: Any
) -> dict[str, Any]:
    """What the planner needs to price the loaded checkpoint (hwprobe.memory.checkpoint_weights; hwprobe reads no
    files): the label, bits, whether int8 is per channel, and per block (packed weights, scale groups, act-order
    input features: one permutation per merged projection).  `layer_of`: a tensor name's block index or None."""
    layers = [[0, 0, 0] for _ in range(n_layers)]
    perms: set[tuple[int, str]] = set()
    for m in modules:
        i = layer_of(m.prefix + ".weight")
        if i is None or i >= n_layers:
            continue
        layers[i][0] += m.out_features * m.in_features
        layers[i][1] += m.out_features * m.in_features // loaded_group(quant, m.in_features)
        leaf = m.prefix.rsplit(".", 1)[-1]
        if quant.desc_act and m.has_g_idx and (i, _SHARED_INPUT.get(leaf, leaf)) not in perms:
            perms.add((i, _SHARED_INPUT.get(leaf, leaf)))
            layers[i][2] += m.in_features
    return {
        "label": quant.label,
        "bits": quant.bits,
        "per_channel": quant.group_size == -1,
        "layers": [tuple(x) for x in layers],
    }


SIDE_FILES = ("quantize_config.json", "quant_config.json")  # AutoGPTQ / GPTQModel, AutoAWQ
SIDE_KEY = "quantize_config"  # ModelSpec.metadata key of a side file's config (hf_folder puts it there)


def spec_quant(path: str, metadata: dict[str, Any]) -> CheckpointQuant | None:
    """The quantization of a ModelSpec built by hf_folder (from its metadata: config.json, and the side file's
    config when there was one); None for a GGUF or a 16-bit folder."""
    config = metadata.get("config")
    if not isinstance(config, dict):
        return None
    side = metadata.get(SIDE_KEY)
    return find_quant_config(config, {SIDE_KEY: side} if side is not None else {}, path)
