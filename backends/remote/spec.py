"""What hearth knows of a remote model: its name and where it is served.  Nothing of its shapes (0 = unknown):
the planner and the model store never see a remote model, and its server applies its chat template."""

from __future__ import annotations

from dataclasses import dataclass

from backends.modelspec import REMOTE_FORMAT, ModelSpec


@dataclass(frozen=True)
class RemoteTarget:
    """Where the remote model lives and how to reach it."""

    url: str  # the API base, ending in /v1 ("http://host:8000" is taken as "http://host:8000/v1")
    model: str | None = None  # the id to ask for; None = the first id the server lists at /v1/models
    api_key: str | None = None  # sent as "Authorization: Bearer KEY"; never a CLI flag (it would show in ps)
    key_source: str = "no key"  # where the key came from, for the message when the server refuses it
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # between two chunks of a stream (a long prefill on a busy server)


def api_base(url: str) -> str:
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def remote_spec(name: str, url: str, context_length: int = 0) -> ModelSpec:
    """A ModelSpec for model `name` served at `url` (context_length 0 = the server did not say)."""
    return ModelSpec(
        path=url,
        format=REMOTE_FORMAT,
        name=name,
        architecture="remote",
        n_layers=0,
        hidden_size=0,
        n_heads=0,
        n_kv_heads=0,
        head_dim=0,
        ffn_size=0,
        vocab_size=0,
        context_length=context_length,
        rope_base=0.0,
        rope_scaling={},
        rms_eps=0.0,
        n_experts=0,
        n_experts_used=0,
        sliding_window=0,
        file_type="remote",
        file_size_bytes=0,
        param_count=0,
        tensor_types={},
        tensors=(),
        tied_embeddings=False,
        chat_template=None,
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=None,
        add_bos_token=False,
        add_eos_token=False,
        tokenizer_model="remote",
        tokenizer_pre="",
    )
