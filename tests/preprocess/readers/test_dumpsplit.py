"""Byte ranges of a bzip2 dump (preprocess.readers.dumpsplit): every page exactly once, whatever the cut; broken files."""
from __future__ import annotations

import bz2
import io
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

TestPipeline.__test__ = False  # a Beam class whose name pytest would otherwise try to collect

from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess.readers import dumpsplit, wikipedia
from preprocess.readers.inputs import open_uri
from preprocess.executors.beamrun import beam_options
from preprocess.stages import documents

CFG = SourceConfig()


@pytest.fixture(scope="module")
def whole_records(real_wiki) -> list[tuple]:
    return _records(wikipedia.iter_wikipedia(str(real_wiki), CFG))


def _records(items) -> list[tuple]:
    return [(r.doc_id, getattr(r, "text", None) or r.reason) for r in items]


def _read_ranges(uri: str, ranges) -> list[tuple]:
    return [r for lo, hi in ranges for r in _records(wikipedia.iter_wikipedia(uri, CFG, byte_range=(lo, hi)))]


def _dump(pages: int, words_per_page: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(5000)]
    body = []
    for page in range(pages):
        text = " ".join(rng.choice(vocab, words_per_page))
        body.append(f"  <page>\n    <title>P{page}</title>\n    <ns>0</ns>\n    <id>{page + 1}</id>\n"
                    f"    <revision><text>{text}</text></revision>\n  </page>\n")
    return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n  <siteinfo><dbname>testwiki</dbname>'
            "</siteinfo>\n" + "".join(body) + "</mediawiki>\n").encode()


def _snapped(uri: str, size: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` moved to block starts, as the reader's exact pieces are (``WikipediaReader.pieces``)."""
    with open_uri(uri, decompress=False) as raw:
        return dumpsplit.snap_to_blocks(raw, size, ranges)


def test_the_readers_exact_pieces_are_block_aligned_and_cover_the_dump(real_wiki, whole_records):
    size = os.path.getsize(real_wiki)
    pieces = wikipedia.READER.pieces(str(real_wiki), size, 4, exact=True)
    ranges = [piece[1:] for _, piece in pieces]
    assert ranges == _snapped(str(real_wiki), size, dumpsplit.byte_ranges(size, 4)) and len(ranges) > 1
    assert abs(sum(share for share, _ in pieces) - 1) < 1e-9
    assert _read_ranges(str(real_wiki), ranges) == whole_records


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 20])
def test_real_dump_ranges_hold_every_page_once(real_wiki, whole_records, pieces):
    size = os.path.getsize(real_wiki)
    even = [(i * size // pieces, (i + 1) * size // pieces) for i in range(pieces)]
    assert _read_ranges(str(real_wiki), even) == whole_records
    snapped = _snapped(str(real_wiki), size, even)
    assert snapped[0][0] == 0 and snapped[-1][1] == size and len(snapped) <= pieces
    assert _read_ranges(str(real_wiki), snapped) == whole_records


def test_blocks_decoded_alone_give_the_file(real_wiki):
    data = real_wiki.read_bytes()
    blocks = list(dumpsplit.iter_blocks(io.BytesIO(data), 0))
    assert len(blocks) == 7  # 6.1 MB of XML in 900 kB blocks
    assert b"".join(chunk for _, chunk in blocks) == bz2.decompress(data)
    # Each block starts where a block magic is, at any bit offset.
    assert {start % 8 for start, _ in blocks} != {0}


def test_magics_are_found_at_every_bit_shift():
    for shift in range(8):
        bits = np.zeros(200, np.uint8)
        magic_bits = np.unpackbits(np.frombuffer(dumpsplit.BLOCK_MAGIC.to_bytes(6, "big"), np.uint8))
        bits[40 + shift:88 + shift] = magic_bits
        data = np.packbits(bits).tobytes()
        assert dumpsplit.find_magics(data) == [(40 + shift, "block")]


def test_multistream_and_many_blocks(tmp_path):
    xml = _dump(pages=300, words_per_page=400)
    middle = xml.index(b"  <page>", len(xml) // 3)
    path = tmp_path / "multi.xml.bz2"
    path.write_bytes(bz2.compress(xml[:middle], 1) + bz2.compress(xml[middle:], 1))  # 100 kB blocks
    whole = _records(wikipedia.iter_wikipedia(str(path), CFG))
    assert len(whole) == 300
    size = path.stat().st_size
    for pieces in (2, 5, 11):
        even = dumpsplit.byte_ranges(size, pieces)
        assert _read_ranges(str(path), even) == whole
        assert _read_ranges(str(path), _snapped(str(path), size, even)) == whole


def test_a_page_longer_than_a_block_leaves_ranges_without_pages(tmp_path):
    xml = _dump(pages=3, words_per_page=250_000)  # each page spans several 100 kB blocks
    path = tmp_path / "long.xml.bz2"
    path.write_bytes(bz2.compress(xml, 1))
    size = path.stat().st_size
    ranges = dumpsplit.byte_ranges(size, size // dumpsplit.MIN_RANGE_BYTES)
    per_range = [_records(wikipedia.iter_wikipedia(str(path), CFG, byte_range=r)) for r in ranges]
    assert [] in per_range
    assert [r for rs in per_range for r in rs] == _records(wikipedia.iter_wikipedia(str(path), CFG))


def test_truncated_dump_read_by_ranges(tmp_path, real_wiki):
    data = real_wiki.read_bytes()
    cut = tmp_path / real_wiki.name
    cut.write_bytes(data[: len(data) * 2 // 3])
    size = cut.stat().st_size
    with pytest.raises(InputError) as info:
        _read_ranges(str(cut), dumpsplit.byte_ranges(size, 3))
    assert "ends early" in str(info.value) and str(cut) in str(info.value)


def test_corrupt_block_read_by_ranges(tmp_path, real_wiki):
    data = bytearray(real_wiki.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    bad = tmp_path / real_wiki.name
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError) as info:
        _read_ranges(str(bad), dumpsplit.byte_ranges(len(data), 4))
    assert "corrupt compressed data" in str(info.value) and str(bad) in str(info.value)


def test_split_large_files_then_read_gives_the_whole_dump(real_wiki, whole_records):
    uri = str(real_wiki)
    with TestPipeline(options=beam_options([])) as p:
        units = p | beam.Create([("wiki", uri)]) | beam.ParDo(documents.SplitLargeFiles(300_000))
        ranges = units | "Ranges" >> beam.Map(lambda unit: unit[2][0]) | beam.combiners.Count.PerElement()
        assert_that(ranges, equal_to([("bytes", 5)]), label="five ranges")
        docs = (units | beam.ParDo(documents.ReadSourceFile(CFG))
                | beam.Map(lambda r: (r.doc_id, getattr(r, "text", None) or r.reason)))
        assert_that(docs, equal_to(whole_records), label="every page once")


def test_not_bzip2_at_all(tmp_path):
    path = tmp_path / "fake.xml.bz2"
    path.write_bytes(b"<mediawiki></mediawiki>" * 100)
    with pytest.raises(InputError) as info:
        list(wikipedia.iter_wikipedia(str(path), CFG, byte_range=(0, 1000)))
    assert "no bzip2 block" in str(info.value)



def test_ranges_of_one_file_share_its_header(real_wiki, whole_records):
    size = os.path.getsize(real_wiki)
    headers: dict[str, bytes] = {}
    got = [r for lo, hi in dumpsplit.byte_ranges(size, 4)
           for r in _records(wikipedia.iter_wikipedia(str(real_wiki), CFG, byte_range=(lo, hi), headers=headers))]
    assert got == whole_records
    with open(real_wiki, "rb") as raw:
        assert headers == {str(real_wiki): dumpsplit.dump_header(raw)}
    assert headers[str(real_wiki)].startswith(b"<mediawiki") and b"<dbname>enwiki</dbname>" in headers[str(real_wiki)]
