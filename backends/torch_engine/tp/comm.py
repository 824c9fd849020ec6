"""The collectives the tensor-parallel layers need, over torch.distributed's default process group.

gloo on CPU, NCCL on CUDA.  Every collective is bounded by the group's timeout (`timeout_s`, HEARTH_TP_TIMEOUT_S,
default 120 s): a rank that died is seen at once (its sockets close), and a rank that hangs ends the step after
the timeout instead of freezing the engine.  On gloo the partial sums are added in float32 (a bf16 all-reduce
would round every partial sum), on NCCL in the activation dtype (the bandwidth is what a step waits for).

One tensor-parallel group per process: torch.distributed's default group is process-wide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import torch

from backends.env import env_seconds
from backends.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0


def timeout_s() -> float:
    return env_seconds("HEARTH_TP_TIMEOUT_S", DEFAULT_TIMEOUT_S)


@dataclass
class Comm:
    """This rank's place in the group and the collectives over it."""

    rank: int
    world: int
    backend: str  # "gloo" | "nccl"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over every rank, in x's dtype (float32 on the way over gloo)."""
        import torch.distributed as dist  # lazy: heavy: torch (~3 s)

        if self.world == 1:
            return x
        if self.backend == "gloo" and x.dtype != torch.float32:
            y = x.float()
            dist.all_reduce(y)
            return y.to(x.dtype)
        dist.all_reduce(x)
        return x

    def gather_columns(self, x: torch.Tensor, widths: list[int]) -> torch.Tensor | None:
        """x: (rows, widths[rank]) on every rank -> (rows, sum(widths)) on rank 0 (None elsewhere): the head's
        vocabulary slices side by side.  Padded to the widest slice, as gather wants equal shapes."""
        import torch.distributed as dist  # lazy: heavy: torch (~3 s)

        if self.world == 1:
            return x
        widest = max(widths)
        if x.shape[1] < widest:
            x = torch.nn.functional.pad(x, (0, widest - x.shape[1]))
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        if parts is None:
            return None
        return torch.cat([p[:, :w] for p, w in zip(parts, widths)], dim=1)


def init_group(rank: int, world: int, port: int, device: torch.device, store=None) -> Comm:
    """Join the group whose TCPStore rank 0 serves on 127.0.0.1:port (rank 0 passes its own `store`)."""
    import torch.distributed as dist  # lazy: heavy: torch (~3 s)

    if dist.is_initialized():
        raise ConfigError(
            "this process already runs a tensor-parallel group", "close the other tensor-parallel model first"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s())
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return Comm(rank, world, backend)


def make_store(world: int):
    """Rank 0's TCPStore on a free port of 127.0.0.1 (port 0: the OS picks; no race with other programs)."""
    import torch.distributed as dist  # lazy: heavy: torch (~3 s)

    return dist.TCPStore(
        "127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout_s()), wait_for_workers=False
    )


def leave_group() -> None:
    import torch.distributed as dist  # lazy: heavy: torch (~3 s)

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            log.debug("destroy_process_group failed while leaving the group", exc_info=True)
