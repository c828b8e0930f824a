"""The plan of a run: built once from the config, inputs and tokenizer; the executors only schedule its stages."""
from __future__ import annotations

import pickle

import apache_beam as beam
import pytest

from common import preprocess_config as config_module
from common import storage
from common.tokenizer import load_tokenizer
from preprocess import handoff, layout
from preprocess.executors.beamrun import beam_options
from preprocess.executors.plan import Plan
from tests.preprocess.conftest import REPO_ROOT

FILES = [("wiki", "enwiki-1.xml.bz2", 3 << 20), ("book", "a.txt", 1 << 20), ("book", "b.txt", 1 << 20)]


@pytest.fixture(scope="module")
def tok(bert_vocab):
    return load_tokenizer(str(bert_vocab))


def _plan(tok, tmp_path, overrides=(), slices=1) -> Plan:
    cfg = config_module.load(REPO_ROOT / "configs/preprocess/tiny.yaml", list(overrides))
    return Plan.build(cfg, FILES, tok, str(tmp_path / "out.incomplete"), str(tmp_path / "tokenizer"), slices=slices)


def test_the_plan_carries_the_config_and_tokenizer_to_every_stage(tok, tmp_path):
    plan = _plan(tok, tmp_path, ["parts=2", "output.provenance=true", "seed=7"], slices=4)
    assert plan.parts == 2 and plan.seed == 7 and plan.vocab_size == tok.vocab_size and plan.mask_id == tok.mask_id
    assert plan.num_buckets >= 4, "every slice gets a document bucket of its own"
    assert {"doc_a", "doc_b"} <= set(plan.output_schema.names)
    assert "doc_a" not in _plan(tok, tmp_path).output_schema.names
    assert plan.work.startswith(plan.staging)
    # Each part's input files: every file once, the large dump alone.
    assert sorted(f for part in plan.file_parts() for f in part) == sorted((k, u) for k, u, _ in FILES)
    assert [("wiki", "enwiki-1.xml.bz2")] in plan.file_parts()
    # The local pool sends the plan to its worker processes.
    assert pickle.loads(pickle.dumps(plan)) == plan


def _write_index(plan: Plan, non_empty: list[int], **extra) -> None:
    offsets = [0]
    for bucket in range(plan.num_buckets):
        offsets.append(offsets[-1] + (bucket in non_empty))
    storage.write_json(storage.join(plan.work, layout.INDEX_NAME), {"bucket_offsets": offsets, **extra})


def test_instance_units_are_each_non_empty_bucket_once_in_order(tok, tmp_path):
    plan = _plan(tok, tmp_path, slices=4)
    non_empty = [b for b in range(plan.num_buckets) if b % 3]
    _write_index(plan, non_empty)
    slices = plan.instance_units(3)
    assert len(slices) == 3 and [b for s in slices for b in s] == non_empty
    assert all(max(a) < min(b) for a, b in zip(slices, slices[1:]) if a and b)


def test_pairs_units_are_runs_of_buckets_each_run_by_the_slice_of_its_first_bucket(tok, tmp_path):
    plan = _plan(tok, tmp_path, slices=8)
    bits = plan.bucket_bits
    non_empty = [b for b in range(plan.num_buckets) if b % 4 != 1]
    _write_index(plan, non_empty, unit_bits=bits - 1)   # two buckets a unit
    slices = plan.instance_units(3)
    units = [u for s in slices for u in s]
    assert units == sorted(set(b >> 1 for b in non_empty))
    index = storage.read_json(storage.join(plan.work, layout.INDEX_NAME))
    assert [b for u in units for b in layout.unit_buckets(index, u)] == non_empty   # every bucket once, in order
    _write_index(plan, [1], unit_bits=0)
    assert [u for s in plan.instance_units(3) for u in s] == [0]


def test_full_sentences_units_are_packing_streams_each_run_by_the_slice_of_its_first_bucket(tok, tmp_path):
    plan = _plan(tok, tmp_path, ["instances.kind=full_sentences", "instances.sentence_objective=none"], slices=8)
    assert "doc_starts" in plan.output_schema.names
    bits = plan.bucket_bits
    # Streams finer than buckets (several in one bucket), and coarser (one over several buckets).
    for stream_bits, slices in ((bits + 1, 3), (bits - 2, 3), (0, 5)):
        _write_index(plan, list(range(plan.num_buckets)), stream_bits=stream_bits)
        units = plan.instance_units(slices)
        assert sorted(u for s in units for u in s) == list(range(1 << stream_bits)) == [u for s in units for u in s]
    _write_index(plan, [0, 2], stream_bits=bits + 1)
    assert [u for s in plan.instance_units(3) for u in s] == [0, 1, 4, 5]  # streams of empty buckets are skipped


def _reshuffles(build) -> list[str]:
    """The Reshuffles that the stages put into a pipeline (not counting the input's Create)."""
    pipeline = beam.Pipeline(options=beam_options([]))
    build(pipeline)
    names = [t.unique_name for t in pipeline.to_runner_api().components.transforms.values()]
    return [name for name in names if name.endswith("/Reshuffle") or "Spread" in name.rsplit("/", 1)[-1]]


def test_with_a_lot_the_stages_keep_their_elements_in_this_process(tok, tmp_path):
    plan = _plan(tok, tmp_path)

    def stages(lot):
        return lambda p: (p | beam.Create([("book", "a.txt")], reshuffle=False) | plan.documents(0, lot)
                          | plan.index(lot) | plan.instances(0, lot) | plan.shards(lot))

    assert len(_reshuffles(stages(None))) >= 4  # files, documents, buckets and shards spread over the workers
    with handoff.open_lot() as lot:
        assert _reshuffles(stages(lot)) == []
