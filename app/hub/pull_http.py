"""Which HTTP library huggingface_hub uses: 1.x uses httpx, 2.x its fork httpx2 (same API, other module).
Its transport errors (connection refused, dropped mid-body) are caught by that module's exception classes."""

from __future__ import annotations

from types import ModuleType


def http_module() -> ModuleType:
    try:
        import httpx2  # lazy: optional dependency (ImportError handled)

        return httpx2
    except ImportError:
        import httpx  # lazy: optional dependency (ImportError handled)

        return httpx
