"""A memory budget for one-machine runs: ``--max-memory SIZE`` chooses the number of parts (``--parts``).

The DirectRunner holds a stage's data in memory, so a run's peak grows with the input of its largest part. The
estimate per part is a fixed base plus a factor per input byte as stored, by the memory class its reader gives the
file (``Reader.memory_class``): a ``.bz2`` dump counts compressed (its text is about 3.6 times larger), and wikitext
yields fewer tokens per byte than a book. The base
is what a part needs whatever its size: the interpreter, Apache Beam's runner and the tokenizer, and the buffers
of the instance and shard stages, which hold a bucket and a key-range group at a time.

The constants come from ``python -m bench.preprocess.calibrate`` (``memory_calibration`` in the benchmark's
results): slopes fitted by least squares to one-part runs of each kind at 1, 8 and 32 copies of the benchmark
corpus and rounded up, then the smallest base under which the estimate is at or above the peak of every run,
split runs of 8 and 32 copies included, plus 10 MiB for the spread of a peak between runs. A part's instance stage
cuts its rows by the corpus's key-range groups up to 512 transport groups (``preprocess.layout.TRANSPORT_GROUP_BITS``),
so below that count it also grows a little with the whole corpus, which the split runs cover; the peak per stored
byte of one part falls as the input grows. The plain-XML slope is older and was not measured again. The smallest
number of parts whose estimate fits is chosen; the output does not depend on it.

Beam's runners hold a part's files whole, so there no part can be lighter than its heaviest file
(``estimated_peak``). The local pool (``executors.local``) cuts large files into units, pieces of a file or its
bucket ranges, which its slices claim until each holds its share: there a part holds less than its share plus its
largest unit (``pool_peak``), so one large file, even a compressed one, fits a budget as well as many small ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from common.errors import InputError
from common.sizes import format_size
from preprocess import readers

# Peak bytes of one in-memory run per input byte, by memory class, and the base every run needs (see the module
# docstring). The first three are fitted; those of the config's ``inputs:`` formats are estimates: their text is
# plain, as a book's (6.0); compressed, a file counts 2.5 times that (gzip and zstd make text 3-4 times smaller; a
# .bz2 dump counts 2.1 times its plain slope), Parquet's columns are compressed inside the file (twice a book's),
# and a datasets directory's Arrow files hold uncompressed text, as a book. Checked for JSON lines by
# bench.preprocess.formats: 4.1 B per byte above the base for .jsonl at 8x (one part), 14.0 for a part of a
# .jsonl.zst of zstd level 3 (2.8 times smaller); a file compressed harder counts more per stored byte.
PEAK_BYTES_PER_INPUT_BYTE = {"wiki_compressed": 7.5, "wiki": 3.5, "book": 6.0,
                             "jsonl": 6.0, "jsonl_compressed": 15.0, "text": 6.0, "text_compressed": 15.0,
                             "parquet": 12.0, "datasets": 6.0}
BASE_PEAK_BYTES = 340 << 20
MAX_POOL_PARTS = 1024  # the local pool's parts are tried up to this many


def input_kind(key: str, uri: str) -> str:
    """The memory class of an input file (``Reader.memory_class``): the key of its slope."""
    return readers.reader_of(key).memory_class(uri)


def weighted_bytes(key: str, uri: str, size: int, slopes: dict[str, float] = PEAK_BYTES_PER_INPUT_BYTE) -> float:
    """What a file adds to the peak of the part that holds it."""
    return slopes[input_kind(key, uri)] * size


@dataclass(frozen=True)
class PartsChoice:
    parts: int
    estimated_peak: int          # of the heaviest part
    budget: int

    def describe(self) -> str:
        return (f"max-memory {format_size(self.budget)}: {self.parts} part{'s' if self.parts > 1 else ''} "
                f"(estimated peak {format_size(self.estimated_peak)} per part)")


def split_parts(files: list[tuple[str, str, int]], parts: int) -> list[list[tuple[str, str]]]:
    """Greedy size-balanced grouping of the input files (largest first, ties by name)."""
    loads = [[0, i, []] for i in range(parts)]
    for key, uri, size in sorted(files, key=lambda f: (-f[2], f[1])):
        target = min(loads, key=lambda load: (load[0], load[1]))
        target[0] += size
        target[2].append((key, uri))
    return [sorted(load[2]) for load in loads if load[2]]


def estimated_peak(files: list[tuple[str, str, int]], parts: int,
                   slopes: dict[str, float] = PEAK_BYTES_PER_INPUT_BYTE, base: int = BASE_PEAK_BYTES) -> int:
    """Base + the weighted input of the heaviest part of the documents stage (``split_parts``), or of an even
    share of the whole input (the instances stage splits the documents evenly), whichever is larger.

    Args:
        slopes, base: the constants (``bench.preprocess.calibrate`` fits others with them).
    """
    weight = {uri: weighted_bytes(key, uri, size, slopes) for key, uri, size in files}
    heaviest = max(sum(weight[uri] for _, uri in part) for part in split_parts(files, min(parts, len(files))))
    return int(base + max(heaviest, sum(weight.values()) / parts))


Units = Callable[[int], list[tuple[str, float]]]  # slices -> (uri, the share of its file) of each unit


def pool_peak(files: list[tuple[str, str, int]], parts: int, processes: int, units_of: Units,
              slopes: dict[str, float] = PEAK_BYTES_PER_INPUT_BYTE, base: int = BASE_PEAK_BYTES) -> int:
    """The local pool's estimate: with one part a process may claim every unit (the whole input); with more, each of
    ``max(processes, parts)`` slices claims units until it holds its share, so it ends below its share plus the
    largest unit.

    Args:
        units_of: the units the pool cuts for a number of slices (``executors.local.plan_units``), each as its
            file's uri and the share of that file it holds.
    """
    weight = {uri: weighted_bytes(key, uri, size, slopes) for key, uri, size in files}
    total = sum(weight.values())
    if parts == 1:
        return int(base + total)
    slices = max(processes, parts)
    largest = max((weight[uri] * share for uri, share in units_of(slices)), default=0.0)
    return int(base + total / slices + largest)


def choose_parts(files: list[tuple[str, str, int]], budget: int, processes: int = 0,
                 units_of: Units | None = None) -> PartsChoice:
    """The fewest parts whose estimated peak fits ``budget``; refuses when none does (on Beam's runners, one input
    file per part; in the local pool, ``MAX_POOL_PARTS``).

    Args:
        files: (key, uri, size in bytes as stored) of every input file.
        processes, units_of: the local pool's worker processes and its units (``pool_peak``); 0 for Beam's runners.
    """
    pool = processes > 0 and units_of is not None
    most = MAX_POOL_PARTS if pool else len(files)
    peaks = []
    for parts in range(1, most + 1):
        peak = pool_peak(files, parts, processes, units_of) if pool else estimated_peak(files, parts)
        if peak <= budget:
            return PartsChoice(parts, peak, budget)
        peaks.append(peak)
    fewest = min(range(most), key=lambda i: (peaks[i], i))
    if pool:
        raise InputError(f"max-memory {format_size(budget)} per worker process is too small for these inputs: even "
                         f"{fewest + 1} parts need an estimated {format_size(peaks[fewest])} each; raise --max-memory "
                         f"to at least that times the processes, or run fewer worker processes")
    raise InputError(f"max-memory {format_size(budget)} is too small for these inputs: even one input file per part "
                     f"({len(files)} parts) needs an estimated {format_size(peaks[-1])}; raise --max-memory to at least "
                     f"that, or split the largest input file")
