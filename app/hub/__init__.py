"""Models from the Hugging Face Hub: `pull()` (app.hub.pull) and the quant choice (app.hub.select).

Importing this package touches no network and does not import huggingface_hub; `pull` does, when called.
"""

from app.hub.pull import PullError, PullProgress, pull

__all__ = ["PullError", "PullProgress", "pull"]
