"""preprocess.readers.wikimedia: Wikipedia as wikimedia/wikipedia's Parquet (id, url, title, text) through
``--wikipedia``. The shared dump slice written in that layout gives the XML dump's documents and byte-identical
shards; its row groups are shared between workers; a file without the layout fails in one line."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import preprocess_config as config_module
from common.errors import InputError
from common.preprocess_config import SourceConfig
from preprocess import text
from preprocess.executors import pipeline
from preprocess.readers import FORMATS, wikimedia
from preprocess.readers.wikipedia import iter_wikipedia
from preprocess.readers.wikitext import clean_wikitext
from preprocess.records import RawDocument, Rejected
from tests.preprocess.conftest import REPO_ROOT, shard_hashes


@pytest.fixture(scope="module")
def as_parquet(real_wiki, tmp_path_factory):
    """The slice's articles as the Hub's files hold them: their text already plain (here: our wikitext cleaning's,
    where the Hub's is wikimedia's own), in a dated language directory, several row groups."""
    pages = [raw for raw in iter_wikipedia(str(real_wiki), SourceConfig()) if isinstance(raw, RawDocument)]
    assert len(pages) > 50
    directory = tmp_path_factory.mktemp("wikimedia") / "20231101.en"
    directory.mkdir()
    table = pa.table({"id": [raw.doc_id.split(":")[2] for raw in pages],
                      "url": [f"https://en.wikipedia.org/wiki?curid={raw.doc_id.split(':')[2]}" for raw in pages],
                      "title": [f"page {i}" for i in range(len(pages))],
                      "text": [clean_wikitext(raw.text) for raw in pages]})
    pq.write_table(table, directory / "train-00000-of-00001.parquet", row_group_size=16)
    return {"file": directory / "train-00000-of-00001.parquet", "pages": pages}


def test_each_row_is_the_dump_s_page_with_its_id_and_sentences(as_parquet):
    cfg = SourceConfig()
    records = list(wikimedia.iter_wikimedia(str(as_parquet["file"])))
    from_xml = [text.to_document(raw, cfg) for raw in as_parquet["pages"]]
    from_parquet = [text.to_document(raw, cfg) for raw in records]
    assert [d.doc_id for d in from_parquet] == [d.doc_id for d in from_xml]
    assert all(d.doc_id.startswith("wiki:enwiki:") for d in from_parquet)
    assert [getattr(d, "sentences", d) for d in from_parquet] == [getattr(d, "sentences", d) for d in from_xml]


def test_the_row_groups_are_shared_between_workers_each_row_once(as_parquet):
    reader = FORMATS["wikipedia"]
    uri = str(as_parquet["file"])
    assert reader.splittable(uri)
    pieces = reader.pieces(uri, as_parquet["file"].stat().st_size, 3)
    assert len(pieces) == 3 and all(piece[0] == "rowgroups" for _, piece in pieces)
    read = [r.doc_id for _, piece in pieces for r in reader.read(uri, piece, None, SourceConfig(), {})]
    assert read == [r.doc_id for r in wikimedia.iter_wikimedia(uri)]


def test_the_parquet_gives_the_xml_dump_s_shards_byte_for_byte(as_parquet, real_wiki, bert_vocab, tmp_path):
    cfg = config_module.load(REPO_ROOT / "configs/preprocess/tiny.yaml")
    outputs = {}
    for name, source in (("xml", real_wiki), ("parquet", as_parquet["file"].parent)):
        outputs[name] = pipeline.run(cfg, wikipedia=[str(source)], books=[], tokenizer=str(bert_vocab),
                                     output=str(tmp_path / name), progress=False)
    assert outputs["parquet"]["rows"] == outputs["xml"]["rows"] > 0
    assert shard_hashes(tmp_path / "parquet") == shard_hashes(tmp_path / "xml")
    assert outputs["parquet"]["statistics"]["documents"]["used"] == outputs["xml"]["statistics"]["documents"]["used"]


def test_the_dbname_comes_from_the_url_or_the_dated_directory():
    assert wikimedia.dbname_of("https://bg.wikipedia.org/wiki/X", "any/file.parquet") == "bgwiki"
    assert wikimedia.dbname_of("https://zh-yue.wikipedia.org/wiki/X", "f.parquet") == "zh_yuewiki"
    assert wikimedia.dbname_of(None, "s3://hub/wikimedia/20231101.sw/train-00000-of-00001.parquet") == "swwiki"
    assert wikimedia.dbname_of("https://example.org/x", "data/train.parquet") == "wiki"


def test_bad_rows_are_dead_letters_and_a_file_without_the_layout_fails_in_one_line(tmp_path):
    good = "A sentence of some length here. And another one follows it."
    pq.write_table(pa.table({"id": ["1", "2", None, "4"], "url": [None] * 4,
                             "text": [good, "", good, good]}), tmp_path / "rows.parquet")
    records = list(wikimedia.iter_wikimedia(str(tmp_path / "rows.parquet")))
    assert isinstance(records[0], RawDocument) and records[0].doc_id == "wiki:wiki:1"
    assert (records[1].outcome, records[1].reason) == ("skipped", "empty")
    assert (records[2].outcome, records[2].reason) == ("failed", "missing_id")
    assert "rows.parquet row group 0 row 2" in records[2].detail and isinstance(records[3], RawDocument)
    pq.write_table(pa.table({"id": [1], "body": [good]}), tmp_path / "other.parquet")
    with pytest.raises(InputError, match=r"other\.parquet: no 'text' column: .*it has id, body"):
        list(wikimedia.iter_wikimedia(str(tmp_path / "other.parquet")))
    assert not isinstance(records[0], Rejected)
