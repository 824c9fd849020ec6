"""Request bodies of Ollama's REST API (github.com/ollama/ollama docs/api.md) as hearth serves them, and the
`options` object mapped onto SamplingParams.

Fields Ollama's API does not have are ignored, as Ollama's server ignores them (a client newer than hearth keeps
working; app/server/ollama_requests.py logs their names at debug), while a known field of the wrong type or range
is a 400 naming it.  `options` is Ollama's Modelfile parameters; each key is one of four kinds:
- sampling options hearth honours: temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
  presence_penalty, frequency_penalty, and num_ctx (a per-request limit within the loaded context);
- load options Ollama uses to (re)load a model (num_gpu, num_thread, num_batch, use_mmap, ...): hearth plans the
  load itself (`hearth plan`) and serves one loaded model, so these are accepted and ignored, as listed in the
  README, because clients send them by default (Open WebUI, Continue);
- sampling options hearth does not implement (mirostat, typical_p, tfs_z, repeat_last_n other than the default,
  ...): a 400 naming the option when set to anything but their "off" value, never ignored;
- keys Ollama does not know either: ignored, as Ollama ignores them (it logs "invalid option provided").

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, min_p 0; num_predict -1 = until the context is full)
except repeat_penalty: Ollama's 1.1 counts the last 64 tokens (repeat_last_n), hearth's penalty every token
generated so far, so a default penalty would not mean the same; it is 1.0 (off) unless the client sets it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from app.durations import duration_seconds

Number = StrictFloat | StrictInt

# Ollama's load-time options (api/types.go Runner): accepted, ignored (hearth's plan decides the load)
LOAD_OPTIONS = frozenset(
    {
        "num_keep",
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "num_thread",
        "penalize_newline",  # deprecated in Ollama, a no-op there too
    }
)
# sampling options hearth does not implement, with the value that means "off" (accepted when sent so)
OFF_VALUES: dict[str, Any] = {
    "mirostat": 0,
    "mirostat_tau": None,  # any value: only used with mirostat on
    "mirostat_eta": None,
    "typical_p": 1.0,
    "tfs_z": 1.0,
    "repeat_last_n": 64,  # Ollama's default window; hearth's repeat_penalty counts every generated token
}
SAMPLING_OPTIONS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "num_predict",
        "stop",
        "num_ctx",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
    }
)
DEFAULTS = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.0, "repeat_penalty": 1.0}


class Options(BaseModel):
    """The honoured options, typed; `check_options` sorts the raw dict first."""

    model_config = ConfigDict(extra="ignore")
    temperature: Number | None = Field(default=None, ge=0)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: Number | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    num_predict: StrictInt | None = Field(default=None, ge=-2)
    stop: list[StrictStr] | StrictStr | None = None
    num_ctx: StrictInt | None = Field(default=None, ge=1)
    repeat_penalty: Number | None = Field(default=None, gt=0)
    presence_penalty: Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(default=None, ge=-2, le=2)


class OptionError(ValueError):
    """An option hearth refuses: (message, option name)."""


def check_options(raw: dict[str, Any] | None) -> tuple[Options, list[str]]:
    """(the honoured options, the ignored options' names: load options and keys nobody knows); OptionError for an
    unimplemented sampling option that is not off."""
    raw = dict(raw or {})
    ignored = sorted(k for k in raw if k in LOAD_OPTIONS or k not in SAMPLING_OPTIONS and k not in OFF_VALUES)
    for key, value in raw.items():
        if key not in OFF_VALUES or value is None:
            continue
        off = OFF_VALUES[key]
        if off is None or value == off or (key == "mirostat" and value == 0):
            continue
        raise OptionError(f"options.{key}={value!r} is not supported by hearth (only {off!r}, off)", key)
    return Options.model_validate({k: v for k, v in raw.items() if k in SAMPLING_OPTIONS and v is not None}), ignored


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")  # Ollama adds "index"
    name: StrictStr
    arguments: dict[str, Any] | StrictStr = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")  # "id" in newer Ollama versions
    function: ToolCallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr = ""
    images: list[StrictStr] | None = None
    tool_calls: list[ToolCall] | None = None
    thinking: StrictStr | None = None  # an earlier reply's reasoning: not sent back to the model (as Ollama)
    tool_name: StrictStr | None = None  # tool: the function whose result this is
    name: StrictStr | None = None  # older clients' spelling of tool_name
    tool_call_id: StrictStr | None = None  # clients that keep OpenAI's ids: the call this result answers


Format = Literal["", "json"] | dict[str, Any]
Think = StrictBool | Literal["low", "medium", "high"]
KeepAlive = StrictStr | StrictInt | StrictFloat


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    stream: StrictBool = True  # Ollama streams unless told not to
    format: Format | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    # the log-probability of each generated token, and of the top_logprobs most likely tokens at its step (0-20)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)


class ChatBody(_Common):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_Common):
    prompt: StrictStr = ""
    system: StrictStr | None = None
    template: StrictStr | None = None
    raw: StrictBool = False
    suffix: StrictStr | None = None
    images: list[StrictStr] | None = None
    context: list[StrictInt] | None = None


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    input: StrictStr | list[StrictStr]
    truncate: StrictBool = True
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    dimensions: StrictInt | None = Field(default=None, ge=1)


class EmbeddingsBody(BaseModel):
    """The older /api/embeddings: one prompt, one `embedding`."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    prompt: StrictStr
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class ModelBody(BaseModel):
    """/api/show, /api/pull (Ollama also takes the older `name`)."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None
    name: StrictStr | None = None
    verbose: StrictBool = False
    insecure: StrictBool = False
    stream: StrictBool = True

    def target(self) -> str | None:
        return self.model or self.name


def keep_alive_seconds(value: KeepAlive | None) -> float | None:
    """Ollama's keep_alive as seconds: a number is seconds, a string a Go duration ("5m", "1h30m", "300ms", "10s");
    negative keeps the model loaded forever (None here); ValueError for anything else (app/durations.py)."""
    if value is None:
        return None
    return duration_seconds(value)
