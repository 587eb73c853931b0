"""Project exceptions.

`LitmtError` marks a mistake the *user* can fix (a bad path, an unknown option, a corrupt
checkpoint). Scripts catch it, print its one-line message and exit with status 2. Anything
else is a bug and keeps its traceback. This module imports nothing from litmt, so every
layer may use it.
"""

from __future__ import annotations


class LitmtError(Exception):
    """A user-fixable error; `str(err)` is one line saying what is wrong and how to fix it."""


class ConfigError(LitmtError, ValueError):
    """An invalid configuration value or combination."""


class BackendError(LitmtError, RuntimeError):
    """An attention backend cannot serve the request (device, dtype, package, feature)."""


class DataError(LitmtError, ValueError):
    """A corpus, split or file cannot be read as asked."""


class CheckpointError(LitmtError, RuntimeError):
    """A checkpoint is missing, corrupt, untrusted or does not match the request."""
