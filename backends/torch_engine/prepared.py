"""A prepared model as plain named tensors and back: what weight_cache.py stores.

`prepared_state(model)` takes a model as the loader and the CPU preparation left it (quantize.prepare_for_cpu:
packed layers, dense prefill copies) and returns (tensors, meta): every parameter and buffer by its name, each
QuantLinear's CPU-packed weight (its CpuPackedWeight's tensor fields, whatever they are) and dense copy under
`<layer>._cpu.<field>` and `<layer>._dense`, and in `meta` the rest (layer attributes, the packed weight's
non-tensor fields, which parameters are one shared tensor, e.g. a tied head, the split projections'
(split_linear.py) part counts, the quantized embeddings' (quant_embedding.py) attributes).  Nothing here names a
layout: a new packed format changes the fields it finds, and weight_cache.PREPARE_FORMAT is bumped.

`restore_prepared(model, tensors, meta)` fills a model built on the meta device (the family's constructor, the
same config) from them: SplitLinear, QuantLinear and QuantEmbedding modules are put where meta lists them, then
every tensor is assigned (no copy: the cache's mapped tensors become the parameters).  A tensor missing, or one
left on the meta device, is a ValueError: the caller treats the entry as corrupt and prepares afresh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from backends.torch_engine.quant_embedding import QuantEmbedding
from backends.torch_engine.quantize import QuantLinear, set_submodule
from backends.torch_engine.split_linear import SplitLinear
from kernels.quant_matmul import QuantWeight
from kernels.quant_matmul_cpu import CpuPackedWeight

_LAYER_ATTRS = ("kind", "group_size", "in_features", "out_features", "impl", "dense_min_rows")


def prepared_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, meta) of a prepared model; see the module docstring."""
    tensors: dict[str, torch.Tensor] = {}
    first: dict[int, str] = {}  # id(tensor) -> the name it was stored under
    aliases: dict[str, str] = {}
    params: list[str] = []
    buffers: list[str] = []
    named = [(n, t, params) for n, t in model.named_parameters(remove_duplicate=False)]
    named += [(n, t, buffers) for n, t in model.named_buffers(remove_duplicate=False)]
    for name, t, kind in named:
        if id(t) in first:
            aliases[name] = first[id(t)]
            continue
        first[id(t)] = name
        tensors[name] = t.detach().contiguous()
        kind.append(name)
    layers: dict[str, Any] = {}
    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear):
            continue
        info: dict[str, Any] = {a: getattr(m, a) for a in _LAYER_ATTRS}
        cpu = m._cpu
        if cpu is not None:
            info["cpu"] = {}
            for f in dataclasses.fields(cpu):
                value = getattr(cpu, f.name)
                if isinstance(value, torch.Tensor):
                    tensors[f"{name}._cpu.{f.name}"] = value.contiguous()
                elif isinstance(value, (str, int, float, bool)):
                    info["cpu"][f.name] = value
                # callables (the bound kernel) are rebuilt on restore
        if m._dense is not None:
            tensors[f"{name}._dense"] = m._dense.contiguous()
        layers[name] = info
    splits = {name: len(m.parts) for name, m in model.named_modules() if isinstance(m, SplitLinear)}
    embeddings = {
        name: {
            "kind": m.kind,
            "group_size": m.group_size,
            "rows": m.num_embeddings,
            "width": m.embedding_dim,
            "dtype": str(m.dtype).removeprefix("torch."),
        }
        for name, m in model.named_modules()
        if isinstance(m, QuantEmbedding)
    }
    meta = {
        "params": params,
        "buffers": buffers,
        "aliases": aliases,
        "quant_layers": layers,
        "split_layers": splits,
        "quant_embeddings": embeddings,
    }
    return tensors, meta


def restore_prepared(model: nn.Module, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> nn.Module:
    """Fill `model` (built on the meta device) from prepared_state's output; ValueError when they do not fit."""
    try:
        layers: dict[str, Any] = meta["quant_layers"]
        _place_modules(model, layers, meta.get("split_layers", {}), meta.get("quant_embeddings", {}))
        for name in meta["params"]:
            module, attr = _owner(model, name)
            old = module._parameters.get(attr)
            _check_shape(name, old, tensors[name])
            module._parameters[attr] = nn.Parameter(
                tensors[name], requires_grad=bool(old.requires_grad) if old is not None else False
            )
        for name in meta["buffers"]:
            module, attr = _owner(model, name)
            _check_shape(name, module._buffers.get(attr), tensors[name])
            module._buffers[attr] = tensors[name]
        for alias, target in meta["aliases"].items():
            module, attr = _owner(model, alias)
            source, source_attr = _owner(model, target)
            shared = source._parameters.get(source_attr, source._buffers.get(source_attr))
            if attr in module._parameters or isinstance(shared, nn.Parameter):
                module._parameters[attr] = shared  # type: ignore[assignment]
            else:
                module._buffers[attr] = shared
        for name, info in layers.items():
            layer = model.get_submodule(name)
            assert isinstance(layer, QuantLinear)
            dense = tensors.get(f"{name}._dense")
            layer._dense = dense
            if "cpu" in info:
                fields = {f.name for f in dataclasses.fields(CpuPackedWeight)}
                values = {f: tensors[f"{name}._cpu.{f}"] for f in fields if f"{name}._cpu.{f}" in tensors}
                values.update({k: v for k, v in info["cpu"].items() if k in fields})
                layer.adopt_cpu_packed(CpuPackedWeight(**values))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"the prepared tensors do not fit this model: {type(exc).__name__}: {exc}") from None
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t is not None and t.is_meta]
    if left:
        raise ValueError(f"the prepared tensors lack {len(left)} of the model's, e.g. {left[0]}")
    return model


def _place_modules(
    model: nn.Module, layers: dict[str, Any], splits: dict[str, int], embeddings: dict[str, Any]
) -> None:
    """Put empty SplitLinear, QuantLinear and QuantEmbedding modules where the entry had them (their tensors are
    assigned afterwards); a layer whose size differs from the model's is a ValueError."""
    for name, n_parts in splits.items():  # first: their parts' names go through them
        plain = model.get_submodule(name)
        set_submodule(model, name, SplitLinear([_shell(layers[f"{name}.parts.{i}"]) for i in range(n_parts)]))
        _check_size(name, plain, model.get_submodule(name))
    for name, info in layers.items():
        if not any(name.startswith(split + ".parts.") for split in splits):
            layer = _shell(info)
            _check_size(name, model.get_submodule(name), layer)
            set_submodule(model, name, layer)
    for name, info in embeddings.items():
        plain = model.get_submodule(name)
        if (plain.num_embeddings, plain.embedding_dim) != (info["rows"], info["width"]):
            raise ValueError(f"{name} is {info['rows']} x {info['width']} in the entry")
        shell = QuantWeight(info["kind"], None, None, None, info["group_size"], info["width"], info["rows"])  # type: ignore[arg-type]
        set_submodule(model, name, QuantEmbedding(shell, getattr(torch, info["dtype"])))


def _shell(info: dict[str, Any]) -> QuantLinear:
    """A QuantLinear of the entry's attributes whose generic buffers stay None: it holds its packed form."""
    shell = QuantWeight(info["kind"], None, None, None, info["group_size"], info["in_features"], info["out_features"])  # type: ignore[arg-type]
    layer = QuantLinear(shell)
    layer.impl = info["impl"]
    layer.dense_min_rows = info["dense_min_rows"]
    return layer


def _check_size(name: str, plain: nn.Module, layer: nn.Module) -> None:
    want = (getattr(plain, "in_features", None), getattr(plain, "out_features", None))
    if want != (layer.in_features, layer.out_features):
        raise ValueError(f"{name} is {layer.in_features}->{layer.out_features} in the entry, {want} in the model")


def _check_shape(name: str, old: torch.Tensor | None, new: torch.Tensor) -> None:
    if old is not None and old.shape != new.shape:
        raise ValueError(f"{name} is {list(new.shape)} in the entry, the model's is {list(old.shape)}")


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent, _, attr = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr
