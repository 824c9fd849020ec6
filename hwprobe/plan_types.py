"""Prefs (what the user asked for) and Plan (what the planner decided), the planner's two seams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PLANNED_BACKENDS = ("llama.cpp", "torch")  # what plan() chooses among (backends.registry.LOCAL_BACKENDS agrees)


@dataclass(frozen=True)
class Prefs:
    """User preferences; None = let the planner decide."""

    backend: str = "auto"  # "auto" | "llama.cpp" | "torch"
    ctx: int | None = None  # context tokens (fixed: the planner will not lower it)
    kv_cache_type: str | None = None  # "f16" | "q8_0" | "q4_0"
    n_gpu_layers: int | None = None  # transformer layers on GPUs (-1 = all): the plan reports what it costs
    quant: str | None = None  # GGUF quant to plan for a config.json ("Q5_K_M"); below Q4_K_M only this way
    target_ctx: int = 8192  # a useful context: the first goal, capped by the model's training context
    min_ctx: int = 4096  # the planner lowers the context down to this before quantizing anything
    n_batch: int = 512  # prompt tokens per forward (llama.cpp n_batch = n_ubatch)
    # the quality budget (`--max-ppl-increase`): formats whose perplexity increase over the model's best format is
    # at most this many %, of which the plan takes the fastest; 0 = the best format only
    max_ppl_increase_pct: float = 1.0
    # this model's measured quality per format (format -> (pct, source)), from `hearth ppl --compare`; they win
    # over hwprobe.quality's defaults
    quality_records: tuple[tuple[str, float, str], ...] = ()
    # `hearth serve` expecting concurrent clients (with backend auto and max_num_seqs > 1): the torch engine,
    # which batches them, wherever it runs the model (GPU, streaming blocks, or the CPU) over llama.cpp's one
    # request at a time (hwprobe.planner.serving)
    prefer_batching: bool = False
    # the torch engine's most sequences at once: its KV pool holds up to this many full-context sequences, as many
    # as the device's budget leaves room for.  What the command will run (app.loading.sequences_for): `hearth run`
    # 1, the chat app a few, `hearth serve` its --max-concurrency
    max_num_seqs: int = 16
    # why max_num_seqs is what it is, for the KV pool's reason ("hearth run answers one prompt at a time"); "" =
    # no command named
    sequences_for: str = ""
    # torch engine ranks (--tensor-parallel N): None = the plan decides (tensor parallelism over NVLink/P2P-
    # joined GPUs when the model fits them in a better torch format than on one); 1 = never; N > 1 = N ranks
    # (N GPUs, or on a machine without GPUs N processes sharing the CPU cores)
    tensor_parallel: int | None = None


@dataclass(frozen=True)
class SpeculativePlan:
    """The torch engine's speculative decoding, as planned (hwprobe.speculative): what `--speculative` became."""

    method: str = "off"  # "off" | "ngram" (prompt lookup) | "draft" (a draft model)
    k: int = 0  # most proposals per request and step (k adapts below it per request); 0 when off
    draft: str | None = None  # the draft model (name or path) when method is "draft"
    draft_weights_mib: int = 0  # the draft's weights and KV pool, counted in the plan's device memory
    draft_kv_mib: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k": self.k,
            "draft": self.draft,
            "draft_weights_mib": self.draft_weights_mib,
            "draft_kv_mib": self.draft_kv_mib,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PlanCandidate:
    """One engine and format the planner raced (hwprobe.race): what it would run at, how fast by the measured
    efficiencies, and what it costs in quality.  `hearth plan --json` lists them under "candidates"."""

    backend: str  # "llama.cpp" | "torch"
    quant: str  # as Plan.quant
    gpus: tuple[int, ...]  # GPUs it runs on; () = CPU
    ctx: int
    kv_cache_type: str
    expected_tokens_per_s: float  # one stream
    expected_aggregate_tokens_per_s: float  # all streams of the command's concurrency together
    efficiency: float  # share of the GPU's bandwidth its decode reaches (of RAM's on the CPU)
    efficiency_source: str  # "measured on this GPU: ...", "table: ...", "assumed: ..."
    ppl_increase_pct: float  # perplexity increase over the model's best format
    quality_source: str
    within_budget: bool  # ppl_increase_pct within --max-ppl-increase
    chosen: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "quant": self.quant,
            "gpus": list(self.gpus),
            "ctx": self.ctx,
            "kv_cache_type": self.kv_cache_type,
            "expected_tokens_per_s": self.expected_tokens_per_s,
            "expected_aggregate_tokens_per_s": self.expected_aggregate_tokens_per_s,
            "efficiency": self.efficiency,
            "efficiency_source": self.efficiency_source,
            "ppl_increase_pct": self.ppl_increase_pct,
            "quality_source": self.quality_source,
            "within_budget": self.within_budget,
            "chosen": self.chosen,
        }


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "gpu" | "cpu"
    index: int | None  # GPU index; None for host RAM
    name: str  # "NVIDIA GeForce RTX 3090" / the CPU model
    weights_mib: int
    kv_mib: int
    compute_mib: int  # compute buffers (activations, logits, attention scratch)
    overhead_mib: int  # CUDA context / runtime
    budget_mib: int  # free memory minus the safety margin: what the plan may use
    # tokens of KV the device holds: the torch engine's paged pool (kv_mib is exactly that pool, which holds
    # kv_pool_tokens // ctx full-context sequences); llama.cpp's one sequence of ctx cells; 0 without KV
    kv_pool_tokens: int = 0
    # host RAM: the torch engine's swap space for preempted requests' KV blocks (hwprobe/swap_space.py), pinned
    swap_mib: int = 0

    @property
    def total_mib(self) -> int:
        return self.weights_mib + self.kv_mib + self.compute_mib + self.overhead_mib + self.swap_mib

    @property
    def headroom_mib(self) -> int:
        return self.budget_mib - self.total_mib

    @property
    def used(self) -> bool:
        return self.total_mib > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "weights_mib": self.weights_mib,
            "kv_mib": self.kv_mib,
            "compute_mib": self.compute_mib,
            "overhead_mib": self.overhead_mib,
            "total_mib": self.total_mib,
            "budget_mib": self.budget_mib,
            "headroom_mib": self.headroom_mib,
            "kv_pool_tokens": self.kv_pool_tokens,
            "swap_mib": self.swap_mib,
        }


@dataclass(frozen=True)
class Plan:
    backend: str  # "llama.cpp" | "torch"
    # GGUF quant ("Q4_K_M") or torch weight format ("bf16", "W8A16", "W4A16", "FP8", "W4A16+attn8": attention W8A16
    # and MLP W4A16, "GGUF": own blocks)
    quant: str
    n_gpu_layers: int  # transformer layers on GPUs, 0..n_layers
    n_layers: int
    split_mode: str  # "none" | "layer" | "row" | "tensor"
    tensor_split: tuple[float, ...]  # share per GPU in index order (all GPUs of the report); () = one device
    ctx: int  # context tokens
    kv_cache_type: str  # "f16" | "q8_0" | "q4_0"
    flash_attn: bool
    batch_size: int  # prompt tokens per forward
    devices: tuple[DeviceMemory, ...]  # every GPU in index order, then host RAM
    expected_tokens_per_s: float  # single-stream decode, from memory bandwidth
    reasons: tuple[str, ...]  # short sentences with the numbers; "warning: ..." for quality/memory risks
    main_gpu: int = 0  # the GPU that holds the output head and the biggest compute buffer
    device: str = "cpu"  # torch engine: "cpu" | "cuda" | "cuda:N"
    # torch engine: its KV pool in bytes (whole blocks), what LoadOptions.kv_cache_bytes makes it allocate;
    # 0 for llama.cpp (one sequence of ctx cells)
    kv_pool_bytes: int = 0
    max_num_seqs: int = 1  # sequences the torch engine batches (Prefs.max_num_seqs); the pool's cap
    # MoE expert placement (hwprobe.experts): blocks whose routed experts stay in host RAM, the first ones; their
    # attention, norms, shared experts and KV are on the GPU like every other layer's (n_gpu_layers = n_layers)
    cpu_expert_layers: int = 0
    # torch engine ranks: > 1 with split_mode "tensor" (one per GPU); 1 when none (llama.cpp plans report 1 and
    # keep their split_mode)
    tensor_parallel: int = 1
    serving: bool = False  # planned for concurrent clients (Prefs.prefer_batching with backend auto)
    # tokens of KV the plan reserves: the torch engine's pool (max_num_seqs full-context sequences, or fewer where
    # the budget is tighter; on the CPU the engine commits it in blocks as sequences grow, up to this); llama.cpp's
    # one sequence of ctx cells
    kv_pool_tokens: int = 0
    speculative: SpeculativePlan = SpeculativePlan()  # hwprobe.speculative.plan_speculative fills it
    # torch engine on one GPU: pinned host RAM for preempted requests' KV blocks (hwprobe/swap_space.py; the
    # host's DeviceMemory.swap_mib), what LoadOptions.swap_space_bytes makes it pin; 0 without a GPU
    swap_space_bytes: int = 0
    # the engines and formats raced for this plan, the chosen one marked (hwprobe.race); one entry where there
    # was no race (a fixed --backend with one format, partial offload, the CPU)
    candidates: tuple[PlanCandidate, ...] = ()
    # all streams of the command's concurrency together (`hearth serve`: --max-concurrency; else one stream)
    expected_aggregate_tokens_per_s: float = 0.0

    @property
    def fits(self) -> bool:
        return all(d.headroom_mib >= 0 for d in self.devices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "quant": self.quant,
            "n_gpu_layers": self.n_gpu_layers,
            "n_layers": self.n_layers,
            "split_mode": self.split_mode,
            "tensor_split": list(self.tensor_split),
            "cpu_expert_layers": self.cpu_expert_layers,
            "ctx": self.ctx,
            "kv_cache_type": self.kv_cache_type,
            "flash_attn": self.flash_attn,
            "batch_size": self.batch_size,
            "devices": [d.as_dict() for d in self.devices],
            "expected_tokens_per_s": self.expected_tokens_per_s,
            "reasons": list(self.reasons),
            "tensor_parallel": self.tensor_parallel,
            "serving": self.serving,
            "max_num_seqs": self.max_num_seqs,
            "kv_pool_tokens": self.kv_pool_tokens,
            "speculative": self.speculative.as_dict(),
            "swap_space_bytes": self.swap_space_bytes,
            "expected_aggregate_tokens_per_s": self.expected_aggregate_tokens_per_s,
            "candidates": [c.as_dict() for c in self.candidates],
        }
