"""Errors that carry a message meant for the user.

Everything torchparity raises on bad input derives from :class:`TorchparityError`. The CLI turns
it into a one-line message and exit code 2 instead of a traceback; library users can catch it.
"""

from __future__ import annotations


class TorchparityError(Exception):
    """A problem the user can fix. ``str(err)`` says what is wrong and what to do."""

    exit_code = 2


class UsageError(TorchparityError):
    """Wrong arguments, options or configuration."""


class DumpError(TorchparityError):
    """A dump is missing, truncated, corrupt or does not match the other side."""


class PluginError(TorchparityError):
    """A plugin could not be loaded, configured or found."""
