"""Which experts of an offloaded MoE layer sit in its device cache: the policy, in pure Python (no torch).

A layer's routed experts live in host RAM; the device holds `num_slots` of them.  Each step the layer asks
`assign(needed)` for the experts its tokens were routed to and gets rounds: each round maps at most num_slots
experts to slots and lists the copies (expert -> slot) to make before computing it.  Experts already cached
are served first and copy nothing; a copy evicts the slot whose expert has the lowest score among those the
round does not need.  A step needing more experts than there are slots (a long prompt) takes several rounds.

The score is the routing statistics the engine collects while running: every step's per-expert token counts
(`record`) decay by DECAY and add up, so the cache converges on the most-used experts and follows a
conversation whose topic shifts.  Invariants (tested): no expert in two slots, a slot holds at most one expert,
every needed expert is in exactly one round, a round never maps more than num_slots experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DECAY = 0.95  # per step: a count from 20 steps ago weighs ~0.36 of one now


@dataclass(frozen=True)
class Round:
    slot_of: dict[int, int]  # expert -> slot for the experts computed in this round
    copies: tuple[tuple[int, int], ...]  # (expert, slot) to copy from host RAM before computing


@dataclass
class CacheStats:
    hits: int = 0  # needed experts found in the cache
    misses: int = 0  # needed experts copied in
    steps: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass
class ExpertCachePolicy:
    num_experts: int
    num_slots: int
    decay: float = DECAY
    scores: list[float] = field(default_factory=list)
    expert_in: list[int | None] = field(default_factory=list)  # slot -> expert
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if not 1 <= self.num_slots <= self.num_experts:
            raise ValueError(f"an expert cache needs 1..{self.num_experts} slots, got {self.num_slots}")
        self.scores = [0.0] * self.num_experts
        self.expert_in = [None] * self.num_slots

    def slot_of(self, expert: int) -> int | None:
        try:
            return self.expert_in.index(expert)
        except ValueError:
            return None

    def record(self, counts: Sequence[int]) -> None:
        """Add one step's tokens routed to each expert (decaying the older ones)."""
        if len(counts) != self.num_experts:
            raise ValueError(f"{len(counts)} counts for {self.num_experts} experts")
        self.scores = [s * self.decay + c for s, c in zip(self.scores, counts)]

    def assign(self, needed: Sequence[int]) -> list[Round]:
        """Rounds that compute every expert in `needed` (module docstring); updates the cache's contents."""
        want = sorted(set(needed), key=lambda e: (-self.scores[e], e))  # hottest first
        cached = [e for e in want if self.slot_of(e) is not None]
        missing = [e for e in want if self.slot_of(e) is None]
        self.stats.steps += 1
        self.stats.hits += len(cached)
        self.stats.misses += len(missing)
        rounds: list[Round] = []
        first = True
        while first or missing:
            members = cached if first else []
            first = False
            room = self.num_slots - len(members)
            batch, missing = missing[:room], missing[room:]
            held = set(members)
            # evictable: slots whose expert this round does not compute, coldest (or empty) first
            free = sorted(
                (s for s, e in enumerate(self.expert_in) if e not in held),
                key=lambda s: (
                    self.expert_in[s] is not None,
                    self.scores[self.expert_in[s]] if self.expert_in[s] is not None else 0.0,
                    s,
                ),
            )
            copies = []
            for e, s in zip(batch, free):
                self.expert_in[s] = e
                copies.append((e, s))
            slot_of = {e: self.expert_in.index(e) for e in members + batch}
            rounds.append(Round(slot_of, tuple(copies)))
        return rounds
