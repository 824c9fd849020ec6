"""TPModelRunner: the ModelRunner of rank 0, whose forward runs on every rank of a tensor-parallel group.

The engine half (scheduler, block manager, sampler, the backend's threads) does not change: it sees one runner
with one KV pool of num_blocks blocks, which every rank allocates for its own KV heads (the same block ids on
every rank: a block table means the same thing everywhere).  `forward` sends the step's inputs to the other
ranks (group.py), then runs rank 0's share; the head's gather puts the whole vocabulary's logits on rank 0.
CUDA graphs are off under tensor parallelism (a captured NCCL collective is not set up here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psutil
import torch

from backends.api import LoadOptions
from backends.errors import ConfigError, TensorParallelError
from backends.modelspec import ModelSpec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.tp.partition import head_shards
from backends.torch_engine.tp_group.group import WorkerGroup, rank_options


def check_tensor_parallel(spec: ModelSpec, options: LoadOptions) -> None:
    """Refuse, before any process starts, what a group of options.tensor_parallel ranks cannot run."""
    world = options.tensor_parallel
    if spec.n_experts:
        raise ConfigError(
            f"tensor parallelism does not split mixture-of-experts layers yet ({spec.name} has "
            f"{spec.n_experts} experts)",
            "drop --tensor-parallel",
        )
    head_shards(spec.n_heads, spec.n_kv_heads, world)
    if 0 < options.n_gpu_layers < spec.n_layers:
        raise ConfigError(
            f"--tensor-parallel {world} keeps every layer on the GPUs, but {options.n_gpu_layers} of "
            f"{spec.n_layers} layers were asked for",
            "drop --gpu-layers, or --tensor-parallel",
        )
    device = rank_options(options, 0, world).device
    if device.startswith("cuda"):
        first = int(device.split(":")[1])
        have = torch.cuda.device_count()
        if first + world > have:
            raise ConfigError(
                f"--tensor-parallel {world} needs {world} GPUs from cuda:{first}, this machine has {have}",
                f"use --tensor-parallel {max(1, have - first)}",
            )


class TPModelRunner(ModelRunner):
    """ModelRunner over options.tensor_parallel ranks (this process is rank 0)."""

    def __init__(self, spec: ModelSpec, options: LoadOptions, kernels: str | None = None) -> None:
        check_tensor_parallel(spec, options)
        self.group = WorkerGroup(spec, options, options.tensor_parallel)
        try:
            super().__init__(spec, rank_options(options, 0, options.tensor_parallel), kernels, tp=self.group.comm)
            self.group.wait_ready()
        except BaseException:
            self.group.close()
            raise
        self.options = options
        self._graphs_decided, self.cuda_graphs_off = True, "off (tensor parallel)"

    @torch.inference_mode()
    def forward(
        self,
        seqs: list[tuple[Sequence[int], int, Sequence[int]]],
        logit_rows: str = "last",
        num_decodes: int | None = None,
    ) -> torch.Tensor:
        seqs = [(list(tokens), int(start), list(table)) for tokens, start, table in seqs]
        self.group.send(("forward", seqs, logit_rows, num_decodes))
        try:
            return super().forward(seqs, logit_rows, num_decodes)
        except Exception as exc:
            if self.group.down_reason is None:  # a peer that died, else rank 0's own failure (the others then
                # wait in a collective that will not complete)
                self.group.down(self.group.dead_rank() or f"rank 0's forward failed ({type(exc).__name__}: {exc})")
            raise TensorParallelError(
                f"the tensor-parallel group is down: {self.group.down_reason}",
                "load the model again (in a runner process hearth restarts it itself)",
            ) from exc

    def describe(self) -> dict[str, Any]:
        shards = head_shards(self.spec.n_heads, self.spec.n_kv_heads, self.group.world)
        return {
            **super().describe(),
            "tensor_parallel": self.group.world,
            "tp_rank_pids": self.group.pids,
            "tp_heads": [s.num_heads for s in shards],
            "tp_kv_heads": [s.num_kv_heads for s in shards],
        }

    def ranks_rss_bytes(self) -> int:
        """Resident memory of ranks 1..N-1 (their processes are this engine's too: stats() adds them)."""
        total = 0
        for pid in self.group.pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:  # a rank that just ended
                pass
        return total

    def close(self) -> None:
        super().close()
        self.group.close()
