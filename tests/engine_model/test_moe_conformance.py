"""Mixture-of-experts conformance: tiny random-weight Mixtral-style ("llama" with experts), Qwen2-MoE and
Qwen3-MoE GGUFs (tests/moe_gguf_factory.py) give llama.cpp's logits through the torch engine's paged path, and
the same greedy tokens where there is no near-tie; the HF safetensors names load the same model; routing
statistics count every routed token."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.api import LoadOptions
from backends.errors import ConfigError
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from tests.greedy_agreement import assert_backends_agree
from tests.moe_gguf_factory import write_tiny_moe

ARCHS = ["llama", "qwen2moe", "qwen3moe"]
IDS = [1, 5, 300, 400, 17, 99, 250, 600, 42, 7, 8, 9, 311, 512, 260, 261, 14, 33, 77, 401]
TOL = 1e-3  # of the logit range: the llama-family test's float32 tolerance (test_tiny_conformance.TOL)
OPTS = LoadOptions(n_ctx=128, max_num_seqs=4, dtype="float32", n_batch=64)


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    return {a: write_tiny_moe(root / f"{a}.gguf", a) for a in ARCHS}


class _LlamaCpp:
    def __init__(self, path: Path) -> None:
        from backends.llama_cpp.backend import open_llama

        self.llm = open_llama(str(path), logits_all=True, n_ctx=128, n_threads=2, verbose=False)

    def logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)])

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        out: list[int] = []
        for _ in range(n):
            out.append(int(self.logits(prompt + out)[-1].argmax()))
        return out

    def close(self) -> None:
        self.llm.close()


def _greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(runner.prompt_logits(prompt + out)[-1].argmax()))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_moe_logits_and_greedy_match_llama_cpp(moe_files: dict[str, Path], arch: str) -> None:
    path = moe_files[arch]
    runner = ModelRunner(load_spec(path), OPTS)
    ref_backend = _LlamaCpp(path)
    try:
        ref = ref_backend.logits(IDS)
        scale = max(1.0, float(np.abs(ref).max()))
        ours = runner.prompt_logits(IDS).numpy()
        assert np.abs(ours - ref).max() < TOL * scale
        chunked = runner.prompt_logits(IDS, chunk=7).numpy()  # chunks of 7 on cached blocks
        assert np.abs(chunked - ref).max() < TOL * scale
        a, b = _greedy(runner, IDS[:6], 8), ref_backend.greedy(IDS[:6], 8)
        assert_backends_agree(  # a near-tie at float32's tolerance: twice a logit's (tests/greedy_agreement.py)
            a,
            b,
            IDS[:6],
            {"torch": lambda ids: runner.prompt_logits(ids).numpy(), "llama.cpp": ref_backend.logits},
            2 * TOL * scale,
        )
    finally:
        ref_backend.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_reference_kernels_agree_with_the_grouped_path(moe_files: dict[str, Path], arch: str) -> None:
    spec = load_spec(moe_files[arch])
    fast = ModelRunner(spec, OPTS)
    slow = ModelRunner(spec, OPTS, kernels="reference")
    torch.testing.assert_close(
        slow.prompt_logits(IDS[:12], chunk=5), fast.prompt_logits(IDS[:12]), atol=1e-4, rtol=1e-4
    )


def test_routing_statistics_count_every_routed_token(moe_files: dict[str, Path]) -> None:
    runner = ModelRunner(load_spec(moe_files["qwen3moe"]), OPTS)
    layers = runner.model.moe_layers()
    for moe in layers:
        moe.take_counts()
    runner.prompt_logits(IDS[:10])
    for moe in layers:
        counts = moe.take_counts()
        assert counts.shape == (4,) and int(counts.sum()) == 10 * 2  # 10 tokens x top-2
        assert int(moe.expert_counts.sum()) == 0  # taken: reset


def test_moe_loads_dense_and_refuses_quantized_weights(moe_files: dict[str, Path]) -> None:
    spec = load_spec(moe_files["llama"])
    with pytest.raises(ConfigError, match="dense"):
        ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32", weight_quant="int8"))
    bf16 = ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="bfloat16"))  # auto: "gguf" on CPU
    assert bf16.describe()["weight_quant"] == "none"  # ... which MoE weights do not have: dense, and said so
    assert bf16.model.layers[0].mlp.gate_up_exps.dtype == torch.bfloat16
    assert bf16.model.layers[0].mlp.router.weight.dtype == torch.float32  # the routing decision in float32


def _hf_folder(runner: ModelRunner, folder: Path, arch: str) -> None:
    """The runner's weights under Hugging Face names, one tensor per expert (Mixtral's w1/w3/w2 or Qwen's
    {gate,up,down}_proj), as a safetensors folder with its config.json."""
    from safetensors.torch import save_file

    cfg = runner.model.cfg
    sd = {
        "model.embed_tokens.weight": runner.model.embed.weight,
        "model.norm.weight": runner.model.norm.weight,
        "lm_head.weight": runner.model.lm_head.weight,
    }
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i, layer in enumerate(runner.model.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = layer.attn.qkv_proj.weight.split((q, kv, kv))
        sd.update(
            {
                p + "self_attn.q_proj.weight": wq,
                p + "self_attn.k_proj.weight": wk,
                p + "self_attn.v_proj.weight": wv,
                p + "self_attn.o_proj.weight": layer.attn.o_proj.weight,
                p + "input_layernorm.weight": layer.input_norm.weight,
                p + "post_attention_layernorm.weight": layer.post_norm.weight,
            }
        )
        if layer.attn.qk_norm:  # Qwen3-MoE
            sd.update(
                {
                    p + "self_attn.q_norm.weight": layer.attn.q_norm.weight,
                    p + "self_attn.k_norm.weight": layer.attn.k_norm.weight,
                }
            )
        if layer.attn.qkv_proj.bias is not None:  # Qwen2-MoE
            for part, t in zip("qkv", layer.attn.qkv_proj.bias.split((q, kv, kv))):
                sd[p + f"self_attn.{part}_proj.bias"] = t
        moe = layer.mlp
        mixtral = arch == "llama"
        sd[p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")] = moe.router.weight
        for e in range(cfg.n_experts):
            gate, up = moe.gate_up_exps[e].chunk(2)
            if mixtral:
                names = (
                    "block_sparse_moe.experts.{e}.w1",
                    "block_sparse_moe.experts.{e}.w3",
                    "block_sparse_moe.experts.{e}.w2",
                )
            else:
                names = ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj")
            for n, t in zip(names, (gate, up, moe.down_exps[e])):
                sd[p + n.format(e=e) + ".weight"] = t
        if moe.shared is not None:
            gate, up = moe.shared.gate_up_proj.weight.chunk(2)
            sd.update(
                {
                    p + "mlp.shared_expert.gate_proj.weight": gate,
                    p + "mlp.shared_expert.up_proj.weight": up,
                    p + "mlp.shared_expert.down_proj.weight": moe.shared.down_proj.weight,
                    p + "mlp.shared_expert_gate.weight": moe.shared_gate.weight,
                }
            )
    folder.mkdir()
    save_file({k: v.detach().float().contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    hf_arch = {"llama": "MixtralForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}[
        arch
    ]
    config = {
        "architectures": [hf_arch],
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": 4 * cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope_base,
        "rms_norm_eps": cfg.rms_eps,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "num_experts_per_tok": cfg.n_experts_used,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if arch == "llama":
        config.update(num_local_experts=cfg.n_experts, intermediate_size=cfg.ffn_size)
    else:
        config.update(
            num_experts=cfg.n_experts,
            moe_intermediate_size=cfg.ffn_size,
            norm_topk_prob=cfg.norm_topk_prob,
            shared_expert_intermediate_size=cfg.shared_ffn_size,
            head_dim=cfg.head_dim,
        )
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_folder_matches_its_gguf(moe_files: dict[str, Path], tmp_path: Path, arch: str) -> None:
    gguf_runner = ModelRunner(load_spec(moe_files[arch]), OPTS)
    _hf_folder(gguf_runner, tmp_path / "hf", arch)
    hf_runner = ModelRunner(load_spec(tmp_path / "hf"), OPTS)
    assert hf_runner.model.cfg.norm_topk_prob == gguf_runner.model.cfg.norm_topk_prob
    torch.testing.assert_close(hf_runner.prompt_logits(IDS), gguf_runner.prompt_logits(IDS), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_experts_in_host_ram_with_a_small_cache_give_the_same_logits(moe_files: dict[str, Path], arch: str) -> None:
    """cpu_expert_layers=1: layer 0's experts live on the host with a cache on the "device" (a second set of
    tensors on the CPU).  4 experts, top-2: default_slots gives all 4, so the cache is shrunk to 2 slots to force
    evictions and multi-round prompt steps."""
    from backends.torch_engine.expert_offload import ExpertOffload

    spec = load_spec(moe_files[arch])
    want = ModelRunner(spec, OPTS).prompt_logits(IDS)
    runner = ModelRunner(spec, dataclasses.replace(OPTS, cpu_expert_layers=1))
    first = runner.model.moe_layers()[0]
    assert isinstance(first.offload, ExpertOffload) and runner.model.moe_layers()[1].offload is None
    assert first.gate_up_exps.numel() == 0  # the module holds no experts: the offload does
    assert runner.describe()["expert_cache_slots"] == 4
    off = first.offload
    first.offload = ExpertOffload(off.host_gate_up, off.host_down, torch.device("cpu"), num_slots=2)
    torch.testing.assert_close(runner.prompt_logits(IDS, chunk=5), want, atol=1e-5, rtol=1e-5)
    info = runner.describe()
    assert info["cpu_expert_layers"] == 1 and info["expert_cache_slots"] == 2
    assert info["expert_copied_bytes"] > 0 and 0 <= info["expert_cache_hit_rate"] < 1
    stats = first.offload.policy.stats
    assert stats.misses >= 4 and stats.steps == 4  # 20 tokens in chunks of 5
