"""The proposer interface, the speculative settings, and the per-request adaptive k (pure Python, no torch).

A proposer guesses the next tokens of some running requests; the target model verifies them.  Both proposers
(prompt lookup, a draft model) answer the same call: for each request, up to k token ids and, for a draft model,
the probabilities it drew them from (None: a point mass, which is what prompt lookup is).

Adaptive k, per request (issue 26: no fixed k that costs when proposals are rejected): the speculator proposes the
k that the measured step costs and the request's recent acceptance say pays best, and none when no k beats a
plain decode (cost.py), within a cap kept here: k_max while proposals are being accepted, 1 after a verification
that accepted nothing.  Two misses in a row start a back-off: the request decodes plainly for 1, 2, 4, ... up to
32 steps before it proposes again, and any acceptance ends it.  So when nothing is ever accepted, at most one
step in 32 pays for a verification row: throughput stays within a few percent of speculation off.

Why not a cap of "accepted + 1" (what this was until December 2026): the acceptance already prices a rejection
(the expected tokens 1 + a + ... + a^k), and a cap that shrinks to the accepted count counts it twice.  And one
miss is weak evidence in a sampled reply: a point-mass proposal is rejected with probability 1 - p(x) even while
the reply copies its input, so the back-off waits for the second miss in a row.  Replayed on the bench's
recorded replies (scripts/spec_replay.py: the same texts, the engine's own policy code, the step-cost curve
measured on a 2-core Xeon; 128-token replies, 3 seeds), the old rules against these: grounded greedy 2.20x ->
2.59x, grounded t=0.7 1.24x -> 1.28x, free chat 1.05x -> 1.06x over plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.torch_engine.request import EngineRequest

METHODS = ("off", "ngram", "draft", "auto")
MAX_BACKOFF_STEPS = 32  # the longest a request decodes without proposing after repeated misses
ACCEPTANCE_DECAY = 0.7  # SpecState.acceptance: the weight of the evidence before each verification
DECLINE_DECAY = 0.9  # ... and before each step the cost model declined (cost.py)


@dataclass(frozen=True)
class SpecConfig:
    """What the engine speculates with (built from LoadOptions.speculative / the plan)."""

    method: str = "off"  # "off" | "ngram" | "draft" (the planner resolves "auto" before the engine sees it)
    k_max: int = 8  # most proposals per row and step
    k_start: int = 4  # a request's first k
    ngram_max: int = 4  # prompt lookup: longest suffix matched
    ngram_min: int = 2  # prompt lookup: shortest suffix matched (1 would propose after any repeated token)
    # speculate only in steps with at most this many decode rows: a big batch already keeps the CPU's (or the
    # GPU's) arithmetic busy, and (k + 1)-token verification rows then cost more than the steps they save
    # (measured on the starter, 2-core Xeon, 16 clients: 0.62-0.65x of speculation off without this cut-off)
    max_batch_rows: int = 4


@dataclass
class Proposal:
    """One request's guesses.  probs: the draft model's (len(token_ids), vocab) distributions the tokens were
    drawn from (a torch tensor), or None for a point mass (prompt lookup, or a greedy draft)."""

    token_ids: tuple[int, ...]
    probs: Any = None


class Proposer(Protocol):
    name: str

    def propose(self, requests: Sequence[EngineRequest], ks: Sequence[int]) -> list[Proposal]:
        """Up to ks[i] next tokens for each request (fewer or none when it has no good guess)."""
        ...

    def forget(self, request_id: str) -> None:
        """Drop what the proposer keeps for a finished or preempted request."""
        ...


@dataclass
class SpecState:
    """One request's speculation: its adaptive k, its back-off and its counters."""

    k: int  # the most proposals the next verification may carry (the cost model picks within it)
    skip: int = 0  # steps left to decode without proposing
    backoff: int = 0  # the last back-off's length (0: none yet)
    num_proposed: int = 0  # proposals verified
    num_accepted: int = 0  # of which accepted
    num_verifications: int = 0  # verification rows run
    misses: int = 0  # verifications in a row that accepted nothing
    key: int | None = field(default=None, repr=False)  # noise key of a sampled row (verify.py)
    # recent acceptance: proposals accepted and proposals decided (accepted, or the first rejected one), each
    # decayed by ACCEPTANCE_DECAY per verification so that a run of copied text shows within a few steps
    hits: float = 0.0
    tries: float = 0.0

    @property
    def acceptance(self) -> float:
        """The chance the next proposal is accepted given the ones before it were (prior 1/2 worth 1 try)."""
        return (self.hits + 0.5) / (self.tries + 1.0)

    def decline(self) -> None:
        """The cost model said no this step: the evidence fades toward the prior, so the request tries again."""
        self.hits *= DECLINE_DECAY
        self.tries *= DECLINE_DECAY

    def wants(self) -> bool:
        """Whether the request proposes this step (counts a skipped step down)."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def record(self, num_proposed: int, num_accepted: int, k_max: int) -> None:
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        self.num_verifications += 1
        decided = num_accepted + (1 if num_accepted < num_proposed else 0)
        self.hits = ACCEPTANCE_DECAY * self.hits + num_accepted
        self.tries = ACCEPTANCE_DECAY * self.tries + decided
        if num_accepted == 0:
            self.misses += 1
            self.k = 1  # the next try is the cheapest row
            if self.misses >= 2:  # the first miss may be the sampler's noise (the module docstring)
                self.backoff = min(max(self.backoff * 2, 1), MAX_BACKOFF_STEPS)
                self.skip = self.backoff
        else:
            self.misses = self.backoff = self.skip = 0
            self.k = k_max  # the cost model chooses within it, by the acceptance (the module docstring)
