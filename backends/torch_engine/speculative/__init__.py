"""Speculative decoding in the torch engine: propose k tokens cheaply, verify them in one target forward.

How a step goes (backends/torch_engine/engine.py): the scheduler schedules as always; `Speculator.expand` turns
each eligible one-token decode row into a row of 1 + k tokens (the last sampled token, then k proposals from a
`Proposer`) and gives it blocks for them; the model runner runs the row like a prefill chunk over the cached
prefix (lower-right causal mask) and returns the logits after every token; `Speculator.verify` accepts a prefix
of the proposals and one more token (point-mass proposals: while they equal the target's own tokens, drawn for
every position at once by the sampler with plain decoding's noise, so the output is plain decoding's; a sampled
draft's: the standard rejection rule, so the output keeps the target distribution: verify.py); the scheduler
keeps the KV of the accepted tokens only, returns the blocks past them (`BlockManager.trim`) and hashes only blocks
full of accepted tokens.

Modules: proposer (the interface, the per-request adaptive k, SpecConfig), ngram (prompt lookup), draft (a
smaller model with the same vocabulary, its own paged KV), verify (acceptance), speculator (the engine's hook).
"""
