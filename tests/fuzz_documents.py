"""Structure-aware fuzzing of the files other people hand us: hypothesis strategies that mutate a valid sample
document (drop a key, a wrong type, null, a huge or non-finite number, deep nesting, odd Unicode) or its bytes
(truncated, invalid UTF-8, junk spliced in), and the settings that keep each fuzz test to a few seconds and the same
examples on every run (derandomized, no example database)."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Few examples, each with a deadline: a parser that hangs on one fails that example instead of stalling the suite.
# The deadline is generous because timing benchmarks share the machine's two cores with the tests.
FUZZ = settings(max_examples=60, deadline=3000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Values a hostile or broken file puts where a valid one has something sensible ("\ud800": a lone surrogate, which JSON
# can escape; written raw, encode with errors="surrogatepass" to get the invalid UTF-8 bytes a file would hold).
ODD_VALUES = (
    None, True, False, 0, -1, 2**63, 10**30, -10**30, 1e308, float("nan"), float("inf"), 3.5, "", "x" * 500,
    "1e-4", "768", "../../outside", "/etc/passwd", "\u202e\u0301\U0010ffff", "\ud800", "\x00", [], {}, [1, "a", None],
    {"a": {"b": None}}, [[[[[]]]]],
)
# Characters spliced into a string value: a lone surrogate, NUL, a right-to-left override, the last code point, a BOM.
ODD_CHARACTERS = ("\ud800", "\x00", "\u202e", "\U0010ffff", "\ufeff", "\n")
ODD_KEYS = ("zz_unknown", "", "\u00e9\u0301", "a.b", "../x")
# Bytes spliced into a file: invalid UTF-8, a lone surrogate's bytes, NUL, an unbalanced opener, a byte-order mark.
ODD_BYTES = (b"", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"[", b"{", b"\"", b"\t", b"\r", b"\xef\xbb\xbf",
             b"\\u", b"[" * 64)


def _paths(document: Any, prefix: tuple = ()):
    """Every place in a nested dict/list document, the root included, as a tuple of keys and indices."""
    yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from _paths(value, prefix + (index,))


@st.composite
def mutated(draw, document: Any, max_edits: int = 3) -> Any:
    """``document`` (a JSON/YAML-like value, left untouched) with one to ``max_edits`` edits, each at a place
    drawn from the whole tree: replaced by an odd value, removed, wrapped in a mapping (wrong nesting), or, in a
    mapping, given an unknown key; a string gets an odd character spliced in."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(list(_paths(document))))
        edit = draw(st.sampled_from(("replace", "remove", "wrap", "add_key", "splice")))
        odd = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))  # a copy: the edits below must not alter the table
        if not path:
            document = odd if edit == "replace" else {"x": document} if edit == "wrap" else document
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if edit == "replace":
            parent[last] = odd
        elif edit == "remove":
            del parent[last]
        elif edit == "wrap":
            parent[last] = {"x": parent[last]}
        elif edit == "add_key" and isinstance(parent[last], dict):
            parent[last][draw(st.sampled_from(ODD_KEYS))] = odd
        elif edit == "splice" and isinstance(parent[last], str):
            at = draw(st.integers(0, len(parent[last])))
            parent[last] = parent[last][:at] + draw(st.sampled_from(ODD_CHARACTERS)) + parent[last][at:]
    return document


@st.composite
def damaged_bytes(draw, data: bytes) -> bytes:
    """``data`` cut short, or with odd bytes spliced in (replacing or inserted), at a drawn offset."""
    at = draw(st.integers(0, len(data)))
    junk = draw(st.sampled_from(ODD_BYTES))
    how = draw(st.sampled_from(("truncate", "insert", "overwrite")))
    if how == "truncate":
        return data[:at] + junk
    if how == "insert":
        return data[:at] + junk + data[at:]
    return data[:at] + junk + data[at + len(junk):]


def listing(directory: str | os.PathLike) -> list[str]:
    """Every path under ``directory``, relative and sorted: compared before and after parsing, it shows a parser
    that wrote a file."""
    root = Path(directory)
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))
