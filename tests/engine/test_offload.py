"""Layer offload (backends/torch_engine/offload.py): blocks whose weights live in host memory and are streamed into
rotating device buffers give exactly the resident model's logits; the copies run in the documented order.

On CPU host and device are both the CPU and the copies are plain copies, but the scheduling, the buffer choice
and the binding are the same code as on a GPU: a block computed with another block's (or a half-overwritten)
buffer would change the logits.  The CUDA tests (pinned memory, the side stream, copy/compute overlap) skip
without a GPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import nn

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.offload import CudaSync, LayerStreamer, offload_layers, resident_layer_count
from backends.torch_engine.seams import ScheduledRequest, SchedulerOutput
from tests.gguf_factory import write_tiny_llama

N_LAYERS = 5
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("offload")
    return {
        w: write_tiny_llama(d / f"tiny-{w}.gguf", n_layers=N_LAYERS, weight_type=w, tied=w == "F32", seed=3)
        for w in ("F32", "Q4_0")
    }


def _runner(path: Path, weight_quant: str = "none", **kw) -> ModelRunner:
    opts = dict(n_ctx=64, max_num_seqs=2, dtype="float32", weight_quant=weight_quant, device="cpu")
    opts.update(kw)
    return ModelRunner(load_spec(path), LoadOptions(**opts))


def _steps(vocab: int) -> list[SchedulerOutput]:
    """A chunked prefill of a, then a's rest batched with b's whole prompt, then three batched decodes."""
    rng = random.Random(7)
    a = [rng.randrange(vocab) for _ in range(24)]
    b = [rng.randrange(vocab) for _ in range(12)]
    ta, tb = (3, 0), (5,)
    steps = [
        SchedulerOutput((ScheduledRequest("a", tuple(a[:13]), 0, ta, False),)),
        SchedulerOutput(
            (ScheduledRequest("a", tuple(a[13:21]), 13, ta, True), ScheduledRequest("b", tuple(b[:9]), 0, tb, True))
        ),
    ]
    for k in range(3):
        steps.append(
            SchedulerOutput(
                (
                    ScheduledRequest("a", (a[21 + k],), 21 + k, ta, True, is_decode=True),
                    ScheduledRequest("b", (b[9 + k],), 9 + k, tb, True, is_decode=True),
                )
            )
        )
    return steps


def _run(runner: ModelRunner) -> list[torch.Tensor]:
    return [runner.execute(step).logits for step in _steps(runner.vocab_size)]


def test_resident_layer_count_has_llama_cpp_meaning() -> None:
    assert [resident_layer_count(n, 5) for n in (-1, -7, 0, 3, 5, 9)] == [5, 5, 0, 3, 5, 5]


@pytest.mark.parametrize("weights,weight_quant", [("F32", "none"), ("F32", "int8"), ("F32", "int4"), ("Q4_0", "gguf")])
@pytest.mark.parametrize("num_offloaded", [0, 1, N_LAYERS - 1, N_LAYERS])
def test_offloaded_layers_give_the_resident_models_logits_exactly(
    tiny_models: dict[str, Path], weights: str, weight_quant: str, num_offloaded: int
) -> None:
    """Dense and quantized blocks (QuantLinear qweight / scales / offsets and the CPU dense prefill copy) stream;
    over a chunked prefill and batched decodes every logit is bit-identical to the resident model's."""
    resident = _runner(tiny_models[weights], weight_quant)
    ref = _run(resident)
    runner = _runner(tiny_models[weights], weight_quant)
    streamer = offload_layers(runner.model, N_LAYERS - num_offloaded, runner.device)
    if num_offloaded == 0:
        assert streamer is None and runner.model.offload is None
    else:
        assert streamer is runner.model.offload and streamer.offloaded == tuple(range(num_offloaded))
        kinds = {e.kind for h in streamer._host for e in h.entries}
        # quantized blocks stream their QuantLinear buffers and the dense prefill copy (an attribute)
        assert kinds == ({"param"} if weight_quant == "none" else {"param", "buffer", "attr"})
    out = _run(runner)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    if streamer is not None:
        steps = len(ref)
        # one block stays in its buffer after its first copy; four stream every step (plus the first step's
        # cold copy of block 0, and the next step's block 0 prefetched at the end of each step)
        assert streamer.copies == (1 if num_offloaded == 1 else num_offloaded * steps + 1)
        assert runner.weight_bytes == resident.weight_bytes  # at rest the host copies count, each once


@pytest.mark.parametrize("num_buffers", [1, 3, 4, 9])
def test_any_number_of_buffers_gives_the_same_logits(tiny_models: dict[str, Path], num_buffers: int) -> None:
    ref = _run(_runner(tiny_models["F32"]))
    runner = _runner(tiny_models["F32"])
    streamer = offload_layers(runner.model, 1, runner.device, num_buffers=num_buffers)
    assert all(torch.equal(o, r) for o, r in zip(_run(runner), ref))
    assert streamer is not None and len(streamer._buffers) == min(num_buffers, N_LAYERS - 1)
    if num_buffers == 1:  # no prefetch: each block is copied right before it runs, once per step
        assert streamer.copies == (N_LAYERS - 1) * len(ref)
    if num_buffers >= N_LAYERS - 1:  # every offloaded block fits a buffer: copied once, never again
        assert streamer.copies == N_LAYERS - 1


def _record(
    runner: ModelRunner, num_resident: int, log: list[tuple] | None = None, sync: object = None
) -> tuple[LayerStreamer, list[tuple]]:
    """Offload with a copy that logs ("copy", block, buffer) and blocks that log ("compute", layer, where its
    weights are: "buffer N" or "host")."""
    log = [] if log is None else log
    box: dict[str, LayerStreamer] = {}

    def buffer_of(ptr: int) -> int | None:
        for b, buf in enumerate(box["s"]._buffers):
            if buf.data_ptr() <= ptr < buf.data_ptr() + buf.numel():
                return b
        return None

    def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        s = box["s"]
        block = next(j for j, h in enumerate(s._host) if h.flat.data_ptr() == src.data_ptr())
        log.append(("copy", s.offloaded[block], buffer_of(dst.data_ptr())))
        dst.copy_(src)

    for i, layer in enumerate(runner.model.layers):

        def compute(*args, _i=i, _layer=layer, _forward=layer.forward):
            b = buffer_of(_layer.attn.qkv_proj.weight.data_ptr())
            log.append(("compute", _i, "host" if b is None else f"buffer {b}"))
            return _forward(*args)

        layer.forward = compute
    streamer = offload_layers(runner.model, num_resident, runner.device, copy=copy, sync=sync)  # type: ignore
    assert streamer is not None
    box["s"] = streamer
    return streamer, log


def _decode_twice(runner: ModelRunner) -> None:
    for pos in (0, 1):
        runner.forward([((5,), pos, (0,))], num_decodes=1)


def test_the_next_blocks_copy_is_issued_before_a_block_computes_and_buffers_rotate(
    tiny_models: dict[str, Path],
) -> None:
    runner = _runner(tiny_models["F32"])
    _, log = _record(runner, num_resident=1)  # blocks 0-3 offloaded, block 4 resident
    _decode_twice(runner)
    step1 = [
        ("copy", 0, 0),
        ("copy", 1, 1),
        ("compute", 0, "buffer 0"),
        ("copy", 2, 0),
        ("compute", 1, "buffer 1"),
        ("copy", 3, 1),
        ("compute", 2, "buffer 0"),
        ("copy", 0, 0),
        ("compute", 3, "buffer 1"),  # the next step's block 0, while 3 and 4 compute
        ("compute", 4, "host"),
    ]
    step2 = step1[1:]  # block 0 already waits in buffer 0
    assert log == step1 + step2


def test_an_odd_number_of_offloaded_blocks_shifts_the_rotation(tiny_models: dict[str, Path]) -> None:
    runner = _runner(tiny_models["F32"])
    _, log = _record(runner, num_resident=2)  # blocks 0-2 offloaded
    _decode_twice(runner)
    assert log == [
        ("copy", 0, 0),
        ("copy", 1, 1),
        ("compute", 0, "buffer 0"),
        ("copy", 2, 0),
        ("compute", 1, "buffer 1"),
        ("copy", 0, 1),
        ("compute", 2, "buffer 0"),
        ("compute", 3, "host"),
        ("compute", 4, "host"),
        # step 2: block 0 is in buffer 1 now; the buffer whose block comes last (2) is refilled
        ("copy", 1, 0),
        ("compute", 0, "buffer 1"),
        ("copy", 2, 1),
        ("compute", 1, "buffer 0"),
        ("copy", 0, 0),
        ("compute", 2, "buffer 1"),
        ("compute", 3, "host"),
        ("compute", 4, "host"),
    ]


class _RecordingSync:
    """CudaSync's three calls, logged into the same list as the copies and computes."""

    def __init__(self, log: list[tuple]) -> None:
        self.log = log

    def copy(self, buffer: int, run) -> None:
        run()  # logs ("copy", block, buffer)
        self.log.append(("ready", buffer))

    def wait_ready(self, buffer: int) -> None:
        self.log.append(("wait_ready", buffer))

    def release(self, buffer: int) -> None:
        self.log.append(("release", buffer))


@pytest.mark.parametrize("num_resident", [0, 1, 2])
def test_compute_waits_for_its_own_copy_and_copies_wait_for_the_buffers_last_reader(
    tiny_models: dict[str, Path], num_resident: int
) -> None:
    """The orderings a GPU needs, checked on the calls CudaSync receives: a block computes right after waiting
    for the buffer whose latest copy brought it; a buffer is refilled only after the release that follows the
    last compute reading it."""
    runner = _runner(tiny_models["F32"])
    log: list[tuple] = []
    _record(runner, num_resident, log, _RecordingSync(log))
    _run(runner)
    latest: dict[int, int] = {}  # buffer -> block of its latest copy
    last_reader: dict[int, int] = {}  # buffer -> index in log of the last compute that read it
    released: dict[int, int] = {}  # buffer -> index in log of its latest release
    computes = 0
    for idx, event in enumerate(log):
        if event[0] == "copy":
            _, block, b = event
            assert b not in last_reader or released.get(b, -1) > last_reader[b], log[: idx + 1]
            assert log[idx + 1] == ("ready", b)
            latest[b] = block
        elif event[0] == "compute" and event[2] != "host":
            b = int(event[2].split()[1])
            assert log[idx - 1] == ("wait_ready", b) and latest[b] == event[1], log[: idx + 1]
            assert log[idx + 1] == ("release", b)
            last_reader[b] = idx
            computes += 1
        elif event[0] == "release":
            released[event[1]] = idx
    assert computes == len(_steps(runner.vocab_size)) * (N_LAYERS - num_resident)


class _Tied(nn.Module):
    """Any block works: a weight shared by two Linears, a 0-d buffer and an empty one."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.register_buffer("empty", torch.empty(0, dtype=torch.int64))
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(self.a(x)) * self.scale.float()) + self.empty.sum()


def test_shared_and_empty_tensors_stream_and_stay_shared() -> None:
    torch.manual_seed(0)
    layers = [_Tied() for _ in range(3)]
    x = torch.randn(4, 8)

    def run(streamer: LayerStreamer | None) -> torch.Tensor:
        y = x
        for i, layer in enumerate(layers):
            if streamer is not None:
                streamer.before_layer(i)
            assert layer.a.weight is layer.b.weight
            y = layer(y)
            if streamer is not None:
                streamer.after_layer(i)
        return y

    ref = run(None)
    streamer = LayerStreamer(layers, range(3), torch.device("cpu"))
    assert torch.equal(run(streamer), ref) and torch.equal(run(streamer), ref)
    assert streamer.copies == 3 * 2 + 1  # every block each step, and the third step's block 0 prefetched
    assert layers[0].scale.dtype == torch.float64 and layers[0].scale.shape == ()


def test_offloaded_blocks_rest_in_host_memory_and_describe_reports_them(tiny_models: dict[str, Path]) -> None:
    runner = _runner(tiny_models["F32"])
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    assert runner.describe()["offloaded_layers"] == 0 and runner.offload is None
    runner.offload = offload_layers(runner.model, 2, runner.device)
    _run(runner)
    streamer = runner.offload
    assert streamer is not None
    for i in streamer.offloaded:  # between forwards the modules point into the block's host buffer
        host = streamer._host[i].flat
        for p in runner.model.layers[i].parameters():
            assert host.data_ptr() <= p.data_ptr() < host.data_ptr() + host.numel()
    after = runner.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    block_bytes = sum(p.numel() * p.element_size() for p in runner.model.layers[0].parameters())
    info = runner.describe()
    assert info["offloaded_layers"] == 3
    assert 3 * block_bytes <= info["offload_host_bytes"] < 3 * block_bytes + 3 * 8 * 512  # 8 tensors, aligned
    assert info["offload_buffer_bytes"] == 2 * info["offload_host_bytes"] // 3


def test_n_gpu_layers_does_not_offload_on_cpu(tiny_models: dict[str, Path]) -> None:
    """On CPU every weight is in host memory already: the runner builds no offload for any n_gpu_layers."""
    runner = _runner(tiny_models["F32"], n_gpu_layers=2)
    assert runner.offload is None and runner.model.offload is None
    assert runner.describe()["offload_host_bytes"] == 0


def test_cpu_packed_blocks_cannot_be_offloaded(tiny_models: dict[str, Path]) -> None:
    runner = _runner(tiny_models["Q4_0"], "gguf", dtype="bfloat16")
    if runner.cpu_packed_layers == 0:
        pytest.skip("this CPU has no bf16 int4 kernels, so nothing was packed")
    with pytest.raises(ValueError, match="CPU int4 kernels"):
        offload_layers(runner.model, 1, runner.device)


def test_bad_arguments_are_refused(tiny_models: dict[str, Path]) -> None:
    runner = _runner(tiny_models["F32"])
    with pytest.raises(ValueError, match="between 0 and 5"):
        offload_layers(runner.model, 6, runner.device)
    with pytest.raises(ValueError, match="at least one device buffer"):
        offload_layers(runner.model, 1, runner.device, num_buffers=0)


# ---- CUDA: pinned memory, the side stream, overlap ------------------------------------------------------------


@cuda
def test_cuda_runner_streams_from_pinned_memory_and_matches_the_resident_model(tiny_models: dict[str, Path]) -> None:
    kw = dict(device="cuda", dtype="float16", kv_cache_type="f16")
    resident = _runner(tiny_models["F32"], n_gpu_layers=-1, **kw)
    assert resident.offload is None and resident.describe()["offloaded_layers"] == 0
    runner = _runner(tiny_models["F32"], n_gpu_layers=2, **kw)
    streamer = runner.offload
    assert streamer is not None and streamer.offloaded == (0, 1, 2)
    assert all(h.flat.is_pinned() and h.flat.device.type == "cpu" for h in streamer._host)
    assert all(b.is_cuda for b in streamer._buffers)
    assert isinstance(streamer._sync, CudaSync) and streamer._sync.stream != torch.cuda.current_stream()
    assert all(p.device.type == "cpu" for i in (0, 1, 2) for p in runner.model.layers[i].parameters())
    assert all(p.is_cuda for i in (3, 4) for p in runner.model.layers[i].parameters())
    assert runner.model.embed.weight.is_cuda and runner.model.inv_freq.is_cuda
    assert all(k.is_cuda for k, _ in runner.kv_caches)  # every layer's KV cache stays on the GPU
    # decode-only steps would replay CUDA graphs on the resident runner (padded batches): compare eager to eager
    resident._graphs_decided, resident.cuda_graphs_off = True, "off (test: eager against eager)"
    out, ref = _run(runner), _run(resident)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    assert "offload" in (runner.cuda_graphs_off or "")  # the streamed runner never captures a graph
    assert runner.describe()["offloaded_layers"] == 3


class _Heavy(nn.Module):
    """A block with one (hidden, hidden) weight whose forward runs `reps` matmuls: compute time is tunable."""

    def __init__(self, hidden: int, reps: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.reps = reps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.reps):
            x = torch.tanh(self.proj(x))
        return x


def _time_ms(fn, repeat: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


@cuda
@torch.inference_mode()
def test_cuda_copies_overlap_compute() -> None:
    """Blocks whose copy and compute take about as long: streamed, a step takes about (L + 1) x t rather than the
    2 x L x t of copy-then-compute."""
    hidden, n_layers = 4096, 8  # 32 MiB per fp16 block: ~1.3 ms over PCIe 4.0 x16
    x = torch.randn(2048, hidden, device="cuda", dtype=torch.float16)
    probe = _Heavy(hidden, 1).half().cuda()
    host = torch.empty(hidden * hidden * 2, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    t_copy = _time_ms(lambda: dev.copy_(host, non_blocking=True))
    t_mm = _time_ms(lambda: probe(x))
    reps = max(1, round(t_copy / t_mm))
    layers = [_Heavy(hidden, reps).half().cuda() for _ in range(n_layers)]
    t_compute = _time_ms(lambda: layers[0](x))
    streamer = LayerStreamer(layers, range(n_layers), torch.device("cuda"))

    def step() -> torch.Tensor:
        y = x
        for i, layer in enumerate(layers):
            streamer.before_layer(i)
            y = layer(y)
            streamer.after_layer(i)
        return y

    t_streamed = _time_ms(step)
    serial = n_layers * (t_copy + t_compute)
    assert t_streamed < 0.8 * serial, (t_streamed, t_copy, t_compute)
    assert t_streamed > n_layers * max(t_copy, t_compute) * 0.9  # the link and the math are really both used
