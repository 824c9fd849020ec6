"""Tensor parallelism for the torch engine: what each rank's share of the model is, and how the shares talk.

- partition.py: which heads, FFN rows and vocabulary rows each rank keeps (pure Python, no torch).
- layers.py: the module surgery applied to a loaded model (column-parallel qkv / gate_up, row-parallel o_proj /
  down + all-reduce, vocabulary-parallel embedding and head), for dense and quantized (QuantWeight) projections.
- comm.py: the collectives over torch.distributed (gloo on CPU, NCCL on CUDA), with timeouts.

The processes that run the shares (rank 0's group, the workers, TPModelRunner) live in tp_group/: they build
ModelRunners, and ModelRunner applies this package's transform, so the two halves sit apart (no package cycle
tp <-> model_runner; scripts/import_cycles.py checks it).
"""
