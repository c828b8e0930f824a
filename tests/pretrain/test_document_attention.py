"""Packed rows kept apart: with document ids and per-document positions, a packed row's documents are encoded as
if each were alone (block-diagonal attention); without them, packed rows attend across documents (RoBERTa).
The loader builds both from the rows' doc_starts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.bert.model import BertConfig, BertForPreTraining, Unpadding
from pretrain.data import PretrainingLoader, ShardedInstances, pad, read_rows

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=64)
# fp32 on CPU: a document's attention over its own keys sums the same terms alone or in the packed row (masked
# keys add exact zeros), so only the kernels' summation order differs.
TOLERANCE = 1e-5


def _packed_rows():
    """Two rows of documents (block lengths), padded to 24: the blocks' tokens, starts and the padded tensors."""
    generator = torch.Generator().manual_seed(3)
    rows = [(6, 9, 4), (13, 5)]
    width = 24
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    documents, positions = torch.zeros_like(ids), torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for r, blocks in enumerate(rows):
        start = 0
        for d, length in enumerate(blocks):
            ids[r, start:start + length] = torch.randint(5, CONFIG.vocab_size, (length,), generator=generator)
            documents[r, start:start + length], positions[r, start:start + length] = d, torch.arange(length)
            start += length
        mask[r, :start] = 1
        documents[r, start:], positions[r, start:] = len(blocks) - 1, torch.arange(width - start) + positions[r, start - 1] + 1
    return rows, ids, documents, positions, mask


def _model():
    torch.manual_seed(0)
    return BertForPreTraining(CONFIG).eval()


def test_the_block_diagonal_forward_of_a_packed_row_equals_each_document_alone():
    model = _model()
    rows, ids, documents, positions, mask = _packed_rows()
    types = torch.zeros_like(ids)
    with torch.no_grad():
        hidden, _ = model.bert(ids, types, mask, position_ids=positions, document_ids=documents)
        across, _ = model.bert(ids, types, mask)  # full attention: documents see each other
        unpadding = Unpadding.from_attention_mask(mask)
        free, _ = model.bert(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding,
                               position_ids=unpadding.unpad(positions), document_ids=unpadding.unpad(documents))
        for r, blocks in enumerate(rows):
            start = 0
            for length in blocks:
                alone, _ = model.bert(ids[r:r + 1, start:start + length], types[r:r + 1, start:start + length])
                torch.testing.assert_close(hidden[r, start:start + length], alone[0], rtol=TOLERANCE, atol=TOLERANCE)
                assert not torch.allclose(across[r, start:start + length], alone[0], atol=1e-3)
                start += length
    torch.testing.assert_close(free, hidden[mask.bool()], rtol=TOLERANCE, atol=TOLERANCE)
    assert torch.isfinite(hidden).all()  # padded queries attend to their row's tokens, never to nothing


def test_the_mlm_logits_and_gradients_see_each_document_alone():
    model = _model()
    rows, ids, documents, positions, mask = _packed_rows()
    flat = torch.tensor([2, 7, 30])  # row 0 document 0 and 1, row 1 document 0
    mlm, _ = model(ids, torch.zeros_like(ids), mask, flat, position_ids=positions, document_ids=documents)
    mlm.sum().backward()
    first = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    # The same three predictions from the documents alone (positions restart with each).
    alone = [model(ids[0:1, :6], masked_positions=torch.tensor([2]))[0],
             model(ids[0:1, 6:15], masked_positions=torch.tensor([1]))[0],
             model(ids[1:2, :13], masked_positions=torch.tensor([6]))[0]]
    torch.cat(alone).sum().backward()
    torch.testing.assert_close(mlm, torch.cat(alone).detach(), rtol=TOLERANCE, atol=TOLERANCE)
    for name, p in model.named_parameters():
        if name in first and "pooler" not in name and "seq_relationship" not in name:
            torch.testing.assert_close(first[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def packed(synthetic_dataset):
    return ShardedInstances(synthetic_dataset(1_024, kind="full_sentences", masking="dynamic", document_tokens=40))


def test_the_loader_numbers_documents_and_restarts_positions_at_each_block(packed):
    rows = np.arange(40, 56)
    block = read_rows(packed, rows)
    batch = pad(block, packed.pad_id, documents=True)
    assert "document_ids" not in pad(block, packed.pad_id)
    starts = np.split(block.doc_starts, np.cumsum(block.doc_counts)[:-1])
    assert max(len(s) for s in starts) >= 2
    for b, row_starts in enumerate(starts):
        n = int(block.lengths[b])
        bounds = [*row_starts.tolist(), n]
        want_docs = np.concatenate([np.full(e - s, d) for d, (s, e) in enumerate(zip(bounds, bounds[1:]))])
        want_positions = np.concatenate([np.arange(e - s) for s, e in zip(bounds, bounds[1:])])
        assert (batch["document_ids"][b, :n] == want_docs).all()
        assert (batch["position_ids"][b, :n] == want_positions).all()
        assert (batch["token_type_ids"][b] == 0).all()


def test_document_attention_needs_packed_rows(packed, synthetic_dataset):
    loader = PretrainingLoader(packed, micro_batch=8, accumulation=2, world_size=1, rank=0, seed=1,
                               document_attention=True)
    micro = loader.next_step()
    assert all({"document_ids", "position_ids"} <= set(m) for m in micro)
    pairs = ShardedInstances(synthetic_dataset(2_000))
    with pytest.raises(ValueError, match="document attention needs packed rows .* says its rows are pairs"):
        PretrainingLoader(pairs, micro_batch=8, accumulation=1, world_size=1, rank=0, seed=1, document_attention=True)


def test_altered_doc_starts_are_refused_naming_shard_and_row(synthetic_dataset, tmp_path):
    import json
    import shutil

    import pyarrow as pa
    from pyarrow import ipc

    from common.errors import DatasetFormatError

    copy = tmp_path / "copy"
    shutil.copytree(synthetic_dataset(1_024, kind="full_sentences", masking="dynamic", document_tokens=40), copy)
    shard = copy / json.loads((copy / "manifest.json").read_text())["shards"][0]["name"]
    table = ipc.open_file(pa.memory_map(str(shard))).read_all()
    starts = table.column("doc_starts").to_pylist()
    starts[7] = [3, *starts[7][1:]]  # the first block no longer starts at the row's [CLS]
    index = table.schema.get_field_index("doc_starts")
    table = table.set_column(index, table.schema.field(index), pa.array(starts, table.schema.field(index).type))
    altered = tmp_path / "altered.arrow"
    with pa.OSFile(str(altered), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4096)
    altered.replace(shard)
    data = ShardedInstances(copy)
    read_rows(data, np.arange(7))
    with pytest.raises(DatasetFormatError, match=f"{shard}, row 7: its doc_starts do not start at 0"):
        read_rows(data, np.asarray([100, 7, 3]))
