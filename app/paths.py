"""Where hearth keeps what it writes.  One place, so HEARTH_HOME can relocate all of it.

Without HEARTH_HOME the platform's conventions apply (platformdirs: ~/.local/share/hearth, ~/.config/hearth,
~/.cache/hearth, ~/.local/state/hearth/log on Linux).  With HEARTH_HOME=/some/dir everything hearth writes
(registry, downloaded models, settings, conversations, caches, logs) goes under that one folder, which makes
tests and portable installs hermetic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "hearth"


@dataclass(frozen=True)
class Paths:
    data_dir: Path  # registry.json, models/, conversations.sqlite3
    config_dir: Path  # settings.toml
    cache_dir: Path  # model metadata cache, assembled test models
    log_dir: Path

    @property
    def registry_file(self) -> Path:
        return self.data_dir / "registry.json"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def conversations_db(self) -> Path:
        return self.data_dir / "conversations.sqlite3"

    @property
    def settings_file(self) -> Path:
        return self.config_dir / "settings.toml"

    @property
    def state_file(self) -> Path:
        """Small app state: last used model, last conversation."""
        return self.data_dir / "state.json"

    @property
    def spec_cache_dir(self) -> Path:
        return self.cache_dir / "specs"

    def ensure(self) -> Paths:
        for d in (self.data_dir, self.config_dir, self.cache_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self


def get_paths() -> Paths:
    """The paths for this process (reads HEARTH_HOME each call, so tests can set it per test)."""
    home = os.environ.get("HEARTH_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "data", root / "config", root / "cache", root / "logs")

    return Paths(
        Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
    )
