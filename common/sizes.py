"""Memory sizes as people write them (``1.5G``, ``800M``) and back: the units of ``--max-memory``."""
from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1.5G', '800M', '2GiB', '512MB' or a number of bytes -> bytes (binary units: K = 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"not a memory size: {text!r} (examples: 1.5G, 800M, 2GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_size(size: float) -> str:
    """Bytes -> '1.5G', '800M', '12K' (the units of ``parse_size``)."""
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit]:
            return f"{size / _UNITS[unit]:.3g}{unit}"
    return f"{int(size)}B"
