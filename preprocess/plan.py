"""The plan of a run: its input files, and the document-store buckets they are spread over."""
from __future__ import annotations

from common import storage
from common.errors import InputError
from preprocess import barriers, sources

BYTES_PER_BUCKET = 256 << 10   # input bytes per document-store bucket: small units balance workers


def _input_size(uri: str) -> int:
    try:
        return storage.size_of(uri)
    except Exception as exc:  # noqa: BLE001 - every backend words "missing" and "denied" differently
        raise InputError(f"cannot read {uri}: {exc.__class__.__name__}: {exc}; check that it exists and that "
                         "this machine's credentials may read it") from None


def resolve_inputs(wikipedia: list[str], books: list[str]) -> list[tuple[str, str, int]]:
    """(kind, uri, size in bytes) of every input file; refuses no input, unreadable inputs and clashing names."""
    files = [("wiki", u) for u in sources.expand_inputs(list(wikipedia))] + \
            [("book", u) for u in sources.expand_inputs(list(books))]
    if not files:
        raise InputError("no input files: pass --wikipedia and/or --books")
    names = [sources.source_name(u) for _, u in files]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"input files share a name ({', '.join(dup)}): document ids come from file names, "
                         "so rename one of them")
    return [(kind, uri, _input_size(uri)) for kind, uri in files]


def bucket_bits_for(sized: list[tuple[str, str, int]], slices: int) -> int:
    """Document-store buckets: enough for every slice, and about BYTES_PER_BUCKET of input each."""
    input_bytes = sum(size for _, _, size in sized)
    return min(16, max(barriers.bits_for(slices), barriers.bits_for(input_bytes / BYTES_PER_BUCKET)))
