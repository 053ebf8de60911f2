"""Where OpenJarvis keeps files of its own outside the database: the user's cache folder.

One function, so that XDG_CACHE_HOME means the same thing to every module that caches.
"""

import os
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache (the XDG base-directory default); not created here."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
