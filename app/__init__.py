"""hearth: local LLM inference for consumer NVIDIA GPUs.

`app` is the edge of hearth: the CLI, settings, paths, the model store, conversations, the TUI and the API
server.  Nothing here imports torch, triton or llama_cpp at module level (tests/unit/test_import_hygiene.py
proves it), so `hearth --help`, `hearth --version` and the first TUI paint stay instant.
"""

__version__ = "0.1.0"
