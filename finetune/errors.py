"""Errors shared by the finetuning tasks."""


class DataError(ValueError):
    """A finetuning data file is missing or not in the expected format.

    The message names the file, what was found and what was expected, so the fix is clear without
    reading the code. It subclasses ValueError so callers that already catch bad values still do.
    """
