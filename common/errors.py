"""The error types every stage shares. Each message names the file (or key) at fault and the fix; the entry points
print it as one line."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config file or override that cannot be turned into the typed config."""


class DatasetFormatError(ValueError):
    """A dataset directory that is incomplete, of another format version, or does not match the model."""


class InputError(Exception):
    """Bad input that stops the job: the message names the file (or URI) and the problem and the fix.

    Raised for file-level problems (truncated or corrupt compression, malformed XML, an unreadable
    URI, a vocabulary without the BERT special tokens). Document-level problems become ``Rejected``
    records instead, so one bad page among millions does not stop a run.
    """

    MARKER = "[preprocess input error]"

    def __init__(self, message: str):
        super().__init__(f"{self.MARKER} {message}")
        self.message = message


class OutputLockedError(RuntimeError):
    """Another live process is writing the same output."""
