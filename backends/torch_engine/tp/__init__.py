"""Tensor parallelism for the torch engine: one process per rank, each holding a share of every layer.

- partition.py: which heads, FFN rows and vocabulary rows each rank keeps (pure Python, no torch).
- layers.py: the module surgery applied to a loaded model (column-parallel qkv / gate_up, row-parallel o_proj /
  down + all-reduce, vocabulary-parallel embedding and head), for dense and quantized (QuantWeight) projections.
- comm.py: the collectives over torch.distributed (gloo on CPU, NCCL on CUDA), with timeouts.
- group.py: rank 0's side: spawns the other ranks, watches them, sends them each step's inputs, shuts them down.
- worker.py: a rank > 0: loads its share, then runs every forward rank 0 sends until told to stop.

Rank 0 lives in the engine's own process (the runner process, backends/runner): the scheduler, the block
manager and the sampler run there once, and ModelRunner.forward is the one call that crosses to the other ranks.
"""
