"""How fast each engine and weight format decodes on a GPU, from measurements: the speed model's figures.

A decode step reads every weight once (and its sequence's KV cache), so one stream's time per token is

    bytes read / (peak bandwidth x share) + layers x GPU_SECONDS_PER_LAYER

where `share` is what a given engine's kernels for a given kind of weights reach on a given card.  That share is
measured, never assumed equal for everything (it is not: on the one GPU lent so far, an H200, the torch engine's
bf16 decode reached ~60 % of its peak bandwidth and its int4 kernel ~7 %).  Where it comes from, best
first (`share_for`):

1. this device's own records (GpuInfo.decode_records, from `hearth bench` runs on it: hwprobe.report), keyed by
   engine and kind;
2. the table below, per GPU generation, each row with its source (the committed GPU records' rows,
   hwprobe/recorded_rows.py, over the hand-entered ones); a generation without a row of its own takes the nearest
   generation's and says so;
3. ASSUMED_SHARE, said to be an assumption.

Kinds: the torch engine's "16bit" (bf16/fp16), "int8" (W8A16, GGUF blocks kept as int8), "int4" (W4A16, GGUF
blocks kept as int4), "fp8", "q6" (GGUF Q6_K kept as it is on a GPU); llama.cpp's "ggml" (its quantized
matmul-vector kernels, one figure for every type).  A candidate holding several kinds (the torch engine's GGUF
layout: int4, int8 and q6 blocks beside 16-bit tensors) decodes at the bytes-weighted mix (`mixed_share`).
`batch16` is a whole step's aggregate speed with 16 streams over one stream's (1.0 for llama.cpp, which
llama-cpp-python runs one request at a time).

Pure stdlib: the planner's module, tested with hand-made records.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprobe.bandwidth import GPU_SECONDS_PER_LAYER
from hwprobe.recorded_rows import ROWS

ASSUMED_SHARE = 0.75  # the old single assumption, kept only for what nobody has measured
# the torch engine on a CPU at 16 streams over one: the starter on a 2-core Intel Xeon, 281 against 60.8 tokens/s
# (`hearth bench`, NOTES.md); a CPU with more cores gains more, so this is the low end
TORCH_CPU_BATCH16 = 4.6
ENGINE_KINDS = {"torch": ("16bit", "int8", "int4", "fp8", "q6"), "llama.cpp": ("ggml",)}


@dataclass(frozen=True)
class Measured:
    """One measured decode: tokens/s at one stream and at 16, of a model reading `bytes_per_token` a step with
    `n_layers` blocks, on a card of `bandwidth_gbps`, its peak (the known-GPU table's: the planner multiplies the
    share by the same figure)."""

    tokens_per_s: float
    bytes_per_token: float
    n_layers: int
    bandwidth_gbps: float
    source: str
    tokens_per_s_16: float | None = None  # aggregate at 16 streams; None = not measured

    @property
    def share(self) -> float:
        """The share of bandwidth the weights' reads reached, the launches' fixed cost taken out first."""
        read_s = 1.0 / self.tokens_per_s - self.n_layers * GPU_SECONDS_PER_LAYER
        return min(1.0, self.bytes_per_token / (self.bandwidth_gbps * 1e9 * max(read_s, 1e-9)))

    @property
    def batch16(self) -> float:
        return self.tokens_per_s_16 / self.tokens_per_s if self.tokens_per_s_16 else 1.0


@dataclass(frozen=True)
class Efficiency:
    """What the speed model uses for one engine and kind on one device, and where it came from."""

    share: float  # of the device's peak bandwidth, one stream
    batch16: float  # aggregate tokens/s at 16 streams over one stream's
    source: str  # "measured: ...", "table: ...", "assumed: ..."


_H200 = (
    "scripts/gpu_bench.py on an H200 (sm_90; peak 4,800 GB/s, copy 4,243 measured), Llama-2-7B shapes, the engine "
    "with CUDA graphs"
)
_LLAMA_CPP = "llama.cpp's CUDA build, llama-bench tg (published figures, NOTES.md 'GPUs'): "
_LLAMA_CPP_4090 = _LLAMA_CPP + "Llama-3-8B Q4_K_M on an RTX 4090 (sm_89), ~130 tokens/s"
_LLAMA_CPP_3090 = _LLAMA_CPP + "Llama-3-8B Q4_0 on an RTX 3090 (sm_86), ~157 tokens/s"

# (engine, kind) -> generation -> measurement.  Bytes per token are the models' weights read by a step (the
# token embedding is one row: not read).  Update a row whenever a kernel improves (issue 42's bench/gpu records).
TABLE: dict[tuple[str, str], dict[str, Measured]] = {
    ("torch", "16bit"): {"hopper": Measured(189.0, 13.50e9, 32, 4800, _H200, 2195.0)},
    ("torch", "int8"): {"hopper": Measured(88.5, 7.02e9, 32, 4800, _H200, 1210.0)},
    ("torch", "int4"): {"hopper": Measured(83.6, 4.00e9, 32, 4800, _H200, 950.0)},
    # FP8 reads the bytes of int8 through a kernel of the same shape; its decode was not timed on its own
    ("torch", "fp8"): {"hopper": Measured(88.5, 7.02e9, 32, 4800, _H200 + " (int8's figure: FP8 not timed)", 1210.0)},
    # GGUF Q6_K as it is (kernels/q6_gemv_triton.py, issue 42) has not run on a GPU yet: int8's figure until it has
    ("torch", "q6"): {"hopper": Measured(88.5, 7.02e9, 32, 4800, _H200 + " (int8's figure: q6 not timed)", 1210.0)},
    ("llama.cpp", "ggml"): {
        "ada": Measured(130.0, 4.62e9, 32, 1008, _LLAMA_CPP_4090),
        "ampere": Measured(157.0, 4.37e9, 32, 936, _LLAMA_CPP_3090),
    },
}


def with_recorded(table: dict, rows: dict[tuple[str, str], dict[str, tuple]]) -> dict:
    """`table` with the GPU records' rows (hwprobe/recorded_rows.py's form) over its rows of the same generation: a
    card's record of today's kernels says more than an older run's figures."""
    out = {key: dict(by_generation) for key, by_generation in table.items()}
    for key, by_generation in rows.items():
        out.setdefault(key, {}).update({gen: Measured(*args) for gen, args in by_generation.items()})
    return out


TABLE = with_recorded(TABLE, ROWS)  # the committed records (bench/gpu/, scripts/gpu_record_table.py)

# by compute capability; the order is the order of nearness
GENERATIONS = (("turing", (7, 5)), ("ampere", (8, 0)), ("ada", (8, 9)), ("hopper", (9, 0)), ("blackwell", (10, 0)))


def generation(cc: tuple[int, int] | None) -> str | None:
    """The GPU generation of a compute capability ("ampere" for 8.6), None when unknown."""
    if cc is None:
        return None
    found = None
    for name, first in GENERATIONS:
        if cc >= first:
            found = name
    return found


def _nearest(rows: dict[str, Measured], gen: str | None) -> tuple[str, Measured] | None:
    if not rows:
        return None
    order = [name for name, _ in GENERATIONS]
    if gen in rows:
        return gen, rows[gen]
    at = order.index(gen) if gen in order else len(order) - 1
    best = min(rows, key=lambda g: (abs(order.index(g) - at), -order.index(g)))
    return best, rows[best]


def efficiency(engine: str, kind: str, cc: tuple[int, int] | None, records: tuple = ()) -> Efficiency:
    """The decode efficiency of `engine` on weights of `kind` on a GPU of compute capability `cc`: this device's
    own record (GpuInfo.decode_records entries: objects with engine, kind, share, batch16, source), else the
    table's row for its generation (or the nearest one's, said so), else ASSUMED_SHARE."""
    for r in records:
        if r.engine == engine and r.kind == kind:
            return Efficiency(r.share, r.batch16, f"measured on this GPU: {r.source}")
    gen = generation(cc)
    near = _nearest(TABLE.get((engine, kind), {}), gen)
    if near is None:
        return Efficiency(ASSUMED_SHARE, 1.0, f"assumed {ASSUMED_SHARE:.0%} of bandwidth: nothing measured")
    row_gen, row = near
    where = "" if row_gen == gen else f"; nothing measured on {gen or 'this GPU generation'}, so {row_gen}'s figure"
    return Efficiency(row.share, row.batch16, f"table: {row.source}{where}")


def mixed_share(parts: list[tuple[float, Efficiency]]) -> Efficiency:
    """The efficiency of a step reading several kinds: (bytes, efficiency) each; the time adds up, so the share is
    the bytes-weighted harmonic mean (and so is the batch gain); the sources are joined."""
    parts = [(b, e) for b, e in parts if b > 0]
    if not parts:
        return Efficiency(ASSUMED_SHARE, 1.0, "no weights")
    total = sum(b for b, _ in parts)
    time = sum(b / e.share for b, e in parts)
    batched = sum(b / (e.share * e.batch16) for b, e in parts)
    sources = list(dict.fromkeys(e.source for _, e in parts))
    return Efficiency(total / time, time / batched, " + ".join(sources))


def aggregate_gain(e: Efficiency, streams: int) -> float:
    """Aggregate tokens/s at `streams` concurrent requests over one stream's: the measured gain at 16, linear in
    between (a decode step costs about the same for 1 row as for 16), and no more than that past 16 (not
    measured)."""
    if streams <= 1:
        return 1.0
    return 1.0 + (e.batch16 - 1.0) * min(streams - 1, 15) / 15
