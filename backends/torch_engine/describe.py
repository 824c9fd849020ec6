"""What a ModelRunner reports of itself (ModelRunner.describe): device, dtypes, KV pool, weights, kernels, CPU
threads, offload, experts, CUDA graphs, the scripted decode loop and the kernel self-check.

Its functions take the runner (typed Any: this module sits below model_runner.py, which calls it) and only read
it, so describe() is safe from any thread."""

from __future__ import annotations

from typing import Any

from backends.torch_engine.cpu_head import Int8RowsHead
from backends.torch_engine.cuda_graphs import graph_sizes, unavailable_reason
from backends.torch_engine.expert_offload import describe_offloads
from backends.torch_engine.scripted_decode import describe as describe_scripted


def describe_runner(runner: Any) -> dict[str, Any]:
    """ModelRunner.describe()'s dict."""
    return {
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "kv_dtype": str(runner.kv_dtype).removeprefix("torch."),
        "kv_blocks": runner.num_blocks,
        "kv_cache_bytes": runner.kv_cache_bytes,
        "kv_committed_bytes": runner.kv_pool.committed_bytes,
        "swap_space_bytes": runner.swapper.store.nbytes if runner.swapper is not None else 0,
        "swap_gb_per_s": round(runner.swap_cost.bytes_per_s / 1e9, 2) if runner.swap_cost is not None else 0,
        "kernels": runner.ops.name,
        "weight_quant": runner.weight_quant,
        "weight_bytes": runner.weight_bytes,
        "cpu_packed_layers": runner.cpu_packed_layers,
        "dense_copy_bytes": runner.dense_copy_bytes,
        **({"weight_cache": runner.weight_cache} if runner.weight_cache else {}),
        "int8_head": "on" if int8_head_off(runner) is None else f"off ({int8_head_off(runner)})",
        "tensor_parallel": 1,
        **describe_threads(runner),
        **describe_offload(runner),
        **describe_experts(runner),
        **describe_graphs(runner),
        **describe_scripted(runner.model, runner.device, runner.scripted_decode_off),
        **describe_kernel_check(runner),
    }


def int8_head_off(runner: Any) -> str | None:
    """Why decode rows do not take the int8 head (cpu_head.py); None: they do."""
    head = getattr(runner.model, "lm_head", None)
    return head.off if isinstance(head, Int8RowsHead) and head.off else runner.int8_head_off


def describe_threads(runner: Any) -> dict[str, Any]:
    if runner.device.type != "cpu":
        return {}
    tuner = runner.thread_tuner
    if tuner is None:
        return {"cpu_threads": runner._fixed_threads, "cpu_threads_policy": "fixed"}
    return tuner.describe()


def describe_kernel_check(runner: Any) -> dict[str, Any]:
    if runner.kernel_check_error is not None:
        return {"kernel_check": f"could not run ({runner.kernel_check_error})"}
    if runner.kernel_check is None:
        return {}
    return {**runner.kernel_check.describe(), "kernel_check_reasons": tuple(runner.kernel_check.reasons())}


def describe_experts(runner: Any) -> dict[str, Any]:
    if not runner.spec.n_experts:
        return {}

    return describe_offloads(runner.model)


def describe_graphs(runner: Any) -> dict[str, Any]:
    """Safe from other threads: reads the decision, or predicts it without allocating anything."""
    graphs = runner.decode_graphs
    if graphs is not None:
        return {"cuda_graphs": "on", **graphs.describe()}
    off = (
        runner.cuda_graphs_off
        if runner._graphs_decided
        else unavailable_reason(runner.device, runner.ops.name, runner.model)
    )
    if off is None:  # not set up yet: the sizes it will capture as steps need them
        return {
            "cuda_graphs": "on",
            "cuda_graph_sizes": graph_sizes(runner.options.max_num_seqs),
            "cuda_graphs_captured": (),
        }
    return {"cuda_graphs": off}


def describe_offload(runner: Any) -> dict[str, Any]:
    streamer = runner.offload
    if streamer is None:
        return {"offloaded_layers": 0, "offload_host_bytes": 0, "offload_buffer_bytes": 0}
    return {
        "offloaded_layers": len(streamer.offloaded),
        "offload_host_bytes": streamer.host_bytes,
        "offload_buffer_bytes": streamer.buffer_bytes,
    }
