"""Where residency reads the data it ships and writes what it builds.

- Shipped data (GPU and model profiles, the sample corpora) is package data under
  ``residency/data/``, found through ``importlib.resources``: the same from a checkout, an
  editable install or a wheel installed anywhere. ``$RESIDENCY_PROFILES_DIR`` still points the
  profiles elsewhere.
- What residency builds (sample indexes, tiny and real models, imported SQuAD data) goes under
  ``$RESIDENCY_CACHE`` when set, else the user's cache directory (platformdirs: on Linux
  ``~/.cache/residency``), never beside the code.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from residency.errors import ConfigError

CACHE_ENV = "RESIDENCY_CACHE"


def data_root() -> Path:
    """``residency/data`` as a directory on disk (package data)."""
    root = files("residency") / "data"
    if not isinstance(root, Path):  # a zipped install: files are not on disk
        raise ConfigError(
            "residency's package data is not on disk (installed as a zip?); install it as a "
            "normal wheel: pip install residency"
        )
    return root


def cache_root() -> Path:
    """``$RESIDENCY_CACHE``, else the user's cache directory for residency."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("residency", appauthor=False))
