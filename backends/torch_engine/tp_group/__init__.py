"""The processes of a tensor-parallel group (the sharding itself is backends/torch_engine/tp/).

- group.py: rank 0's side: spawns the other ranks, watches them, sends them each step's inputs, shuts them down.
- worker.py: a rank > 0: loads its share, then runs every forward rank 0 sends until told to stop.
- runner.py: TPModelRunner, rank 0's ModelRunner whose forward runs on every rank.

Rank 0 lives in the engine's own process (the runner process, backends/runner): the scheduler, the block
manager and the sampler run there once, and ModelRunner.forward is the one call that crosses to the other ranks.
"""
