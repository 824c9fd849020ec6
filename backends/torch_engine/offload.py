"""Layer offload as a transform over the plain model: some blocks' weights live in host RAM and are streamed.

`offload_layers(model, num_resident, device)` keeps the last `num_resident` blocks, the embedding, the final
norm and the head on `device` and moves the other blocks' weights into host memory (pinned when `device` is a
GPU, so copies are true asynchronous DMA).  The model's layer loop then calls `model.offload.before_layer(i)` /
`after_layer(i)` (LlamaModel.forward); every layer's KV cache stays on the device.

Why the first blocks go to the host: llama.cpp (and hwprobe.placement.price) keep the *last* n_gpu_layers on the
GPU, so a plan means the same layers for both backends.  It also suits the prefetch: the next step's first
offloaded block is copied while the resident blocks and the head compute.

The schedule (double buffering, `NUM_BUFFERS` = 2 device buffers of the largest offloaded block's size):
    before_layer(j): ensure block j is in a buffer (copy it now if not), then issue the copies of the next
                     num_buffers - 1 offloaded blocks in cyclic order (after the last offloaded block comes the
                     next step's first), each into the buffer whose block is needed furthest in the future,
                     on a side CUDA stream, after that buffer's `free` event; the compute stream waits only on
                     block j's `ready` event.
    after_layer(j):  record block j's buffer `free` event on the compute stream.
So block j+1's copy runs while block j computes, and a copy never overwrites weights a queued kernel still
reads.  With no more offloaded blocks than buffers, every block stays in its buffer after the first step and no
copy happens again (such an offload saves no GPU memory: the buffers hold as much as the blocks did).

Each offloaded block's tensors (parameters, buffers, and a QuantLinear's qweight/scales/offsets/bias and dense
copy) are packed into one flat host byte buffer, so a block crosses the bus in one copy; every buffer slot has
views at the same offsets.  Between its before/after hooks a block's modules point at the views into its
buffer; otherwise at the host views, so the model's state_dict and parameters() always hold the right values.

On CPU (the tests) host and compute device are both the CPU and there are no streams: the copies are plain
copies, and the same scheduling, eviction and binding code runs, so the numerics are checked exactly.
Not combinable with CUDA-graph capture: the copies and event waits happen in Python between the layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from backends.torch_engine.quantize import QuantLinear

NUM_BUFFERS = 2  # device buffers; hwprobe.placement.TORCH_OFFLOAD_BUFFERS repeats this number
# Every tensor starts at a multiple of this in the flat buffers: the CUDA caching allocator's alignment, so the
# views are aligned as the original tensors were and kernels (cuBLAS heuristics, vector loads) see the same.
ALIGN_BYTES = 512

CopyFn = Callable[[torch.Tensor, torch.Tensor], None]  # copy(dst, src), both flat uint8


def _default_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)


def resident_layer_count(n_gpu_layers: int, n_layers: int) -> int:
    """llama.cpp's meaning of n_gpu_layers: how many blocks live on the GPU; negative (-1) = all."""
    return n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)


@dataclass
class _Entry:
    """One tensor slot of a block: module._parameters[name], module._buffers[name] or the attribute `name`."""

    module: nn.Module
    kind: str  # "param" | "buffer" | "attr"
    name: str
    source: int  # which of the block's distinct tensors (two slots may share one)
    offset: int  # bytes into the block's flat buffer
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


def _tensor_slots(block: nn.Module) -> list[tuple[nn.Module, str, str, torch.Tensor]]:
    slots = []
    for module in block.modules():
        if isinstance(module, QuantLinear) and module._cpu is not None:
            raise ValueError("a block re-laid for the CPU int4 kernels cannot be offloaded: it runs on CPU only")
        slots += [(module, "param", n, p) for n, p in module._parameters.items() if p is not None]
        slots += [(module, "buffer", n, b) for n, b in module._buffers.items() if b is not None]
        if isinstance(module, QuantLinear) and module._dense is not None:
            slots.append((module, "attr", "_dense", module._dense))
    return slots


def _view(flat: torch.Tensor, e: _Entry) -> torch.Tensor:
    return flat[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)


class _HostBlock:
    """One offloaded block: its tensors packed into `flat` (host, pinned when `pin`), and where each one sits."""

    def __init__(self, block: nn.Module, pin: bool) -> None:
        self.entries: list[_Entry] = []
        index: dict[int, int] = {}  # id(tensor) -> source: a tensor shared by two slots is stored once
        size = 0
        sources = []
        for module, kind, name, t in _tensor_slots(block):
            if id(t) not in index:
                index[id(t)] = len(sources)
                sources.append((size, t))
                size += -(-t.numel() * t.element_size() // ALIGN_BYTES) * ALIGN_BYTES
            source = index[id(t)]
            self.entries.append(
                _Entry(module, kind, name, source, sources[source][0], t.numel() * t.element_size(), t.dtype, t.shape)
            )
        self.nbytes = size
        self.flat = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        for offset, t in sources:  # a non-contiguous tensor is stored contiguous: same values, dense strides
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            self.flat[offset : offset + raw.numel()].copy_(raw)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The block's tensors as views into `flat` (this block's host buffer or a device buffer)."""
        cache: dict[int, torch.Tensor] = {}
        out = []
        for e in self.entries:
            if e.source not in cache:
                v = _view(flat, e)
                cache[e.source] = nn.Parameter(v, requires_grad=False) if e.kind == "param" else v
            out.append(cache[e.source])
        return out

    def bind(self, views: list[torch.Tensor]) -> None:
        """Point the block's modules at `views` (no copy: a few dict stores)."""
        for e, v in zip(self.entries, views):
            if e.kind == "param":
                e.module._parameters[e.name] = v  # type: ignore[assignment]
            elif e.kind == "buffer":
                e.module._buffers[e.name] = v
            else:
                setattr(e.module, e.name, v)


class CudaSync:
    """The CUDA half of the schedule: copies on a side stream, and per buffer a `ready` event (its copy is done)
    and a `free` event (the kernels reading its previous block are done)."""

    def __init__(self, device: torch.device, num_buffers: int) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.ready = [torch.cuda.Event() for _ in range(num_buffers)]
        self.free = [torch.cuda.Event() for _ in range(num_buffers)]

    def copy(self, buffer: int, run: Callable[[], None]) -> None:
        """run() (the copy into `buffer`) on the side stream once the buffer is free; then mark it ready.  An
        event never recorded (a buffer's first fill) is no wait at all."""
        self.stream.wait_event(self.free[buffer])
        with torch.cuda.stream(self.stream):
            run()
            self.ready[buffer].record(self.stream)

    def wait_ready(self, buffer: int) -> None:
        """Kernels queued from now on the compute stream start after `buffer`'s copy."""
        torch.cuda.current_stream(self.device).wait_event(self.ready[buffer])

    def release(self, buffer: int) -> None:
        """The kernels queued so far on the compute stream are the last readers of `buffer`'s block."""
        self.free[buffer].record(torch.cuda.current_stream(self.device))


class LayerStreamer:
    """Streams the weights of `offloaded` blocks (indices into `layers`) from host memory into `num_buffers`
    rotating buffers on `device` (module docstring: the schedule).  `copy(dst, src)` performs each copy and
    `sync` orders them against the compute (a CudaSync on CUDA, none on CPU); tests pass recording ones.
    Attributes: offloaded (layer indices), host_bytes, buffer_bytes, copies (count)."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        offloaded: Sequence[int],
        device: torch.device,
        num_buffers: int = NUM_BUFFERS,
        copy: CopyFn | None = None,
        sync: CudaSync | None = None,
    ) -> None:
        if num_buffers < 1:
            raise ValueError(f"layer offload needs at least one device buffer, got {num_buffers}")
        if not offloaded:
            raise ValueError("LayerStreamer needs at least one offloaded layer")
        self.device = device
        self.offloaded = tuple(sorted(offloaded))
        self._order = {layer: j for j, layer in enumerate(self.offloaded)}  # layer index -> position j
        cuda = device.type == "cuda"
        self._host = [_HostBlock(layers[i], pin=cuda) for i in self.offloaded]
        num_buffers = min(num_buffers, len(self._host))  # more buffers than blocks would stay empty
        capacity = max(h.nbytes for h in self._host)
        self._buffers = [torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(num_buffers)]
        self._host_views = [h.views(h.flat) for h in self._host]
        # built once: a view per (block, buffer), so a step only swaps references
        self._device_views = [[h.views(b) for b in self._buffers] for h in self._host]
        for h, v in zip(self._host, self._host_views):
            h.bind(v)
        self._copy = copy or _default_copy
        self._held: list[int | None] = [None] * num_buffers  # position j held (or being filled) by each buffer
        self._where: dict[int, int] = {}  # position j -> buffer
        self._sync = sync if sync is not None else CudaSync(device, num_buffers) if cuda else None
        self.copies = 0

    @property
    def host_bytes(self) -> int:
        return sum(h.nbytes for h in self._host)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.numel() for b in self._buffers)

    def before_layer(self, layer: int) -> None:
        """Make `layer`'s weights usable by the next kernels on the current stream; prefetch the next blocks."""
        j = self._order.get(layer)
        if j is None:
            return
        if j not in self._where:  # the first step, or a step that did not start where the last one ended
            self._fetch(j, j)
        k = len(self._host)
        for d in range(1, len(self._buffers)):
            nxt = (j + d) % k
            if nxt == j:
                break
            if nxt not in self._where:
                self._fetch(nxt, j)
        b = self._where[j]
        if self._sync is not None:
            self._sync.wait_ready(b)
        self._host[j].bind(self._device_views[j][b])

    def after_layer(self, layer: int) -> None:
        """`layer`'s kernels are queued: its buffer may be refilled once they have run."""
        j = self._order.get(layer)
        if j is None:
            return
        if self._sync is not None:
            self._sync.release(self._where[j])
        self._host[j].bind(self._host_views[j])

    def _fetch(self, j: int, current: int) -> None:
        """Copy block j into the buffer whose block is needed furthest after `current` (an empty one first)."""
        k = len(self._host)

        def distance(b: int) -> int:
            held = self._held[b]
            return k + 1 if held is None else (held - current) % k

        b = max(range(len(self._buffers)), key=distance)  # the first such buffer on ties
        assert self._held[b] != current or current == j, "would overwrite the block about to compute"
        old = self._held[b]
        if old is not None:
            del self._where[old]
        self._held[b], self._where[j] = j, b
        src = self._host[j].flat
        dst = self._buffers[b][: src.numel()]
        self.copies += 1
        if self._sync is None:
            self._copy(dst, src)
        else:
            self._sync.copy(b, lambda: self._copy(dst, src))


def offload_layers(
    model: nn.Module,
    num_resident: int,
    device: torch.device,
    num_buffers: int = NUM_BUFFERS,
    copy: CopyFn | None = None,
    sync: CudaSync | None = None,
) -> LayerStreamer | None:
    """Keep the last `num_resident` of `model.layers` and everything outside them on `device`; stream the
    others from host memory (module docstring).  Sets and returns `model.offload`; None (and nothing changed)
    when every layer is resident.  The model may sit on the host or on `device` when called; on CUDA the
    offloaded blocks' device memory is handed back to the driver."""
    n = len(model.layers)
    if not 0 <= num_resident <= n:
        raise ValueError(f"resident layers must be between 0 and {n}, got {num_resident}")
    if num_resident == n:
        model.offload = None
        return None
    offloaded = range(n - num_resident)
    streamer = LayerStreamer(model.layers, offloaded, device, num_buffers, copy, sync)
    for i in range(n - num_resident, n):
        model.layers[i].to(device)
    for name, child in model.named_children():
        if name != "layers":
            child.to(device)
    model._apply(lambda t: t.to(device), recurse=False)  # the model's own tensors (RoPE inv_freq)
    model.offload = streamer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return streamer
