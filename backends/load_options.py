"""What a backend can do (`Capabilities`) and what the plan or the user's flags decided about loading it
(`LoadOptions`): the load-time half of the Backend contract, re-exported by backends/api.py (import them from
there).  Pure Python, like the rest of the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.errors import ConfigError


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, readable without importing it (see backends.registry)."""

    concurrent_requests: bool = False  # batches several streams at once (continuous batching)
    preempts: bool = False  # a request of a better priority takes the engine from a running one (which resumes)
    prefix_cache: bool = False  # reuses KV of shared prompt prefixes and reports cached_tokens
    gpu_offload: bool = False  # this installation can place layers on a GPU
    gguf: bool = True  # loads GGUF files
    safetensors: bool = False  # loads Hugging Face safetensors folders
    logits: bool = True  # implements logits() for perplexity and KL
    constraints: bool = False  # honours Request.constraint (constrained decoding); else refuses such requests
    logprobs: bool = False  # fills GenerationEvent.logprobs / prompt_logprobs when SamplingParams asks
    extra_bufts: bool = False  # honours LoadOptions.extra_bufts (llama.cpp's repacked weight buffers)
    local: bool = True  # runs the model on this machine (in a runner process); False = a remote server does
    embeddings: bool = False  # implements embed(): pooled, L2-normalized vectors of token-id inputs


@dataclass(frozen=True)
class LoadOptions:
    """What the plan (or the user's flags) decided about loading.  Backends ignore what does not apply to them
    and say so in `Backend.describe()`; they never silently change a value they do use."""

    n_ctx: int = 4096  # context length in tokens for one sequence
    # transformer layers on GPUs; -1 = all.  Torch engine on CUDA: 0 < n < n_layers keeps the last n resident and
    # streams the others from pinned host RAM (backends/torch_engine/offload.py); -1 and 0 keep all resident
    n_gpu_layers: int = 0
    split_mode: str = "none"  # "none" | "layer" | "row" | "tensor"
    tensor_split: tuple[float, ...] = ()  # share of the model per GPU, in index order
    main_gpu: int = 0
    kv_cache_type: str = "f16"  # "f16" | "q8_0" | "q4_0" (torch engine: "f16"/"bf16"/"fp32")
    flash_attn: bool = False
    n_threads: int | None = None  # CPU threads; None = physical cores
    # on CPU (both engines): n_threads (None: physical cores) is a ceiling and the engine picks the count its
    # steps run fastest with, by timing them (backends/thread_tuner.py); False = exactly n_threads.  The app
    # sets it when the user gave no --threads
    adaptive_threads: bool = False
    n_batch: int = 512  # prompt tokens per forward (llama.cpp n_batch; torch engine token budget)
    max_num_seqs: int = 16  # torch engine: most sequences in one batch
    kv_cache_bytes: int | None = None  # torch engine: KV pool size; None = enough for max_num_seqs x n_ctx
    # torch engine on a GPU: pinned host RAM for preempted requests' KV blocks (the plan's swap_space_bytes;
    # backends/torch_engine/kv_swap.py); 0 = none (always on a CPU, where the KV already is in host RAM)
    swap_space_bytes: int = 0
    dtype: str = "auto"  # torch engine weights: "auto" | "float32" | "bfloat16" | "float16"
    # torch engine weights: "auto" (CPU + bf16 + GGUF -> "gguf", else "none") | "none" (dense in `dtype`) |
    # "gguf" (keep a GGUF's quantized (weight_map.REPACK_KIND) projection blocks) | "int8" | "int4" | "fp8" |
    # "int4+attn8" (attention projections int8, MLP int4) (round-to-nearest, applied by the loader to each
    # projection as it is read)
    weight_quant: str = "auto"
    device: str = "auto"  # torch engine: "auto" | "cpu" | "cuda" | "cuda:N"
    seed: int = 0  # backend-level seed for anything not seeded per request
    logits_all: bool = False  # keep logits of every prompt position (perplexity); llama.cpp then holds
    #                           n_ctx x vocab x 4 bytes of scores, so only `hearth ppl` asks for it
    verbose: bool = False  # let the library print its own logs to stderr
    # llama.cpp: extra weight-buffer types (the CPU repack / AMX paths).  None = the machine's default: on, but off
    # on CPUs with AMX, where some builds crash in the AMX repack path (llama.cpp #20824) until a check passes
    extra_bufts: bool | None = None
    # MoE: the first so many blocks' routed experts stay in host RAM while the rest of every layer is on the GPU
    # (the plan's cpu_expert_layers, hwprobe.experts); llama.cpp: tensor buffer overrides (`--n-cpu-moe N`)
    cpu_expert_layers: int = 0
    # torch engine: ranks of tensor parallelism (one process per GPU, or per share of the CPU cores); 1 = none
    tensor_parallel: int = 1
    # torch engine: speculative decoding (backends/torch_engine/speculative): "off" | "ngram" (prompt lookup) |
    # "draft" (draft_model proposes, the target verifies); the planner turns the user's "auto" into one of these
    speculative: str = "off"
    draft_model: str | None = None  # path of the draft model's GGUF (same vocabulary as the target), for "draft"
    speculative_k: int = 8  # most proposals per request and step (k adapts below it per request)
    # torch engine: the time-to-first-token target (ms) each step is planned for (the best-ranked request still
    # waiting for its first token gets it whenever its prefill alone fits; backends/torch_engine/scheduler.py);
    # 0 = no plan, the plain token budget every step
    ttft_target_ms: float = 500.0
    # torch engine: the JSON file of kernel self-check verdicts per device (backends/torch_engine/kernel_check);
    # None = no self-check (the app passes hearth's cache dir; direct library use and tests opt in)
    kernel_check_record: str | None = None
    # torch engine on CPU: the folder of prepared weights (repacked / packed / dense copies) kept between starts
    # (backends/torch_engine/weight_cache.py); None = prepare on every load (the app passes hearth's cache dir)
    weight_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise ConfigError(f"context length must be at least 16 tokens, got {self.n_ctx}")
        if self.split_mode not in ("none", "layer", "row", "tensor"):
            raise ConfigError(f"split mode must be none, layer, row or tensor, got {self.split_mode!r}")
        if self.cpu_expert_layers < 0:
            raise ConfigError(f"cpu_expert_layers must be >= 0, got {self.cpu_expert_layers}")
        if self.n_batch < 1 or self.max_num_seqs < 1:
            raise ConfigError(f"n_batch and max_num_seqs must be >= 1, got {self.n_batch}, {self.max_num_seqs}")
        if self.tensor_parallel < 1:
            raise ConfigError(f"--tensor-parallel must be 1 or more ranks, got {self.tensor_parallel}")
        if self.speculative not in ("off", "ngram", "draft"):
            raise ConfigError(
                f"--speculative must be off, ngram, draft or auto, got {self.speculative!r}",
                "auto is resolved by the planner before loading",
            )
        if self.speculative == "draft" and not self.draft_model:
            raise ConfigError("--speculative draft needs a draft model", "add --draft-model NAME|PATH")
        if not 1 <= self.speculative_k <= 16:
            raise ConfigError(f"speculative_k must be 1..16, got {self.speculative_k}")
        if not 0 <= self.ttft_target_ms <= 3_600_000:
            raise ConfigError(
                f"--ttft-target-ms must be from 0 (off) to 3600000 ms, got {self.ttft_target_ms}", "the default is 500"
            )
