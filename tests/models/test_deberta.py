"""DeBERTa-v3: the encoder and the masked-LM head against transformers' DebertaV2 (fp32, padded batches, 1e-5), the
log-bucketed relative positions, the padding-free and packed-document modes, the FLOP count and the export."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.deberta_v2 import modeling_deberta_v2 as reference

from common.errors import CheckpointError
from models.attention import Unpadding
from models.deberta_v2 import hf
from models.deberta_v2.model import (
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    DebertaV2Model,
    relative_buckets,
    relative_index,
)
from models.deberta_v2.pair import PRESETS, DebertaPair, encoder_forward_flops, preset

VOCAB = 120
# The tiny preset buckets distances beyond 16 (32 buckets): rows of 40 reach the log-spaced buckets. The v3 shape
# (256 buckets up to 512) only at the tiny width.
CONFIGS = {
    "tiny-buckets": dataclasses.replace(PRESETS["deberta_v3_tiny"], vocab_size=VOCAB),
    "v3-buckets": DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64),
    "c2p-only-typed": dataclasses.replace(PRESETS["deberta_v3_tiny"], vocab_size=VOCAB, pos_att_type=("c2p",),
                                          type_vocab_size=2, position_biased_input=True),
}


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _inputs(batch=3, length=40):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (batch, length), generator=gen)
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    mask = torch.ones_like(ids)
    mask[0, -7:] = 0  # padded rows
    mask[2, -30:] = 0
    ids[mask == 0] = 0
    return ids, types, mask


def _theirs(cfg: DebertaV2Config, cls=transformers.DebertaV2Model, **extra):
    fields = {**dataclasses.asdict(cfg), "pos_att_type": list(cfg.pos_att_type)}
    return cls(transformers.DebertaV2Config(**fields, legacy=False, **extra)).eval()


@pytest.mark.parametrize("buckets,max_position", [(256, 512), (32, 128), (-1, 512)])
def test_relative_buckets_are_the_references(buckets, max_position):
    distance = torch.arange(-700, 701)
    expected = reference.make_log_bucket_position(distance, buckets, max_position) if buckets > 0 else distance
    assert torch.equal(relative_buckets(distance, buckets, max_position), expected.long())


@pytest.mark.parametrize("name", CONFIGS)
def test_encoder_matches_transformers_deberta_v2_model(name):
    torch.manual_seed(0)
    cfg = CONFIGS[name]
    ours = DebertaV2ForMaskedLM(cfg).deberta.eval()  # initialised as pretraining initialises it
    theirs = _theirs(cfg)
    assert theirs.load_state_dict(ours.state_dict(), strict=False).missing_keys == []
    ids, types, mask = _inputs()
    real = mask.bool()
    with torch.no_grad():
        hidden, pooled = ours(ids, types, mask)
        expected = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert pooled is None
    _close(hidden[real], expected[real])


def test_parameter_names_are_transformers(tmp_path):
    cfg = CONFIGS["tiny-buckets"]
    ours = set(DebertaV2ForMaskedLM(cfg).state_dict())
    theirs = set(_theirs(cfg, transformers.DebertaV2ForMaskedLM).state_dict())
    assert ours == theirs - {"deberta.embeddings.position_ids"} or ours == theirs


def test_masked_lm_matches_transformers_deberta_v2_for_masked_lm():
    torch.manual_seed(0)
    cfg = CONFIGS["tiny-buckets"]
    ours = DebertaV2ForMaskedLM(cfg).eval()
    theirs = _theirs(cfg, transformers.DebertaV2ForMaskedLM)
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    ids, types, mask = _inputs()
    real = mask.bool()
    positions = torch.nonzero(mask.reshape(-1)).squeeze(1)[::3]
    with torch.no_grad():
        logits = ours(ids, types, mask)
        some = ours(ids, types, mask, positions)
        expected = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    _close(logits[real], expected[real])
    _close(some, expected.reshape(-1, VOCAB)[positions])


def test_padding_free_mode_gives_the_padded_outputs():
    torch.manual_seed(0)
    encoder = DebertaV2Model(CONFIGS["tiny-buckets"]).eval()
    ids, types, mask = _inputs()
    unpadding = Unpadding.from_attention_mask(mask)
    with torch.no_grad():
        padded, _ = encoder(ids, types, mask)
        free, _ = encoder(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)
    _close(unpadding.pad(free)[mask.bool()], padded[mask.bool()])
    with pytest.raises(ValueError, match="not both"):
        encoder(unpadding.unpad(ids), attention_mask=mask, unpadding=unpadding)


def test_packed_documents_are_encoded_as_if_alone():
    """Positions are relative: a document's tokens see the same distances wherever it starts in the row."""
    torch.manual_seed(0)
    encoder = DebertaV2Model(CONFIGS["tiny-buckets"]).eval()
    first, second = torch.randint(5, VOCAB, (1, 23)), torch.randint(5, VOCAB, (1, 17))
    packed = torch.cat([first, second], 1)
    documents = torch.cat([torch.zeros(1, 23, dtype=torch.long), torch.ones(1, 17, dtype=torch.long)], 1)
    with torch.no_grad():
        together, _ = encoder(packed, document_ids=documents)
        alone = torch.cat([encoder(first)[0], encoder(second)[0]], 1)
    _close(together, alone)


def test_an_attention_variant_not_implemented_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"share_att_key False: only DeBERTa-v3's attention is implemented"):
        DebertaV2Config(share_att_key=False)
    with pytest.raises(ValueError, match=r"pos_att_type 'p2p'"):
        DebertaV2Config(pos_att_type=("p2c", "p2p"))


@pytest.mark.parametrize("length", [20, 40])
def test_flops_count_the_disentangled_attention(length):
    """FlopCounterMode over the encoder's forward (2 rows): the formula per token x tokens, plus the relative
    table's projections (2 per layer and attention type: 2 R H^2 each), which the formula leaves out by design."""
    cfg = CONFIGS["tiny-buckets"]
    encoder = DebertaV2Model(cfg).eval()
    ids = torch.randint(5, VOCAB, (2, length))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        encoder(ids)
    rows = relative_index(length, cfg, "cpu")[2]
    reach = int(relative_buckets(torch.tensor(length - 1), cfg.position_buckets, cfg.max_relative))
    assert rows == 2 * reach + 1 <= 2 * length - 1  # the rows a row reaches, log-bucketed beyond 16: fewer than 2T-1
    projections = cfg.num_hidden_layers * 2 * 2 * rows * cfg.hidden_size ** 2
    # FlopCounterMode does not count the CPU kernel of scaled_dot_product_attention: content-to-content added here.
    sdpa = cfg.num_hidden_layers * 2 * (2 * 2 * length * length * cfg.hidden_size)  # 2 rows x (scores, values)
    counted = counter.get_total_flops() + sdpa
    assert counted == pytest.approx(2 * length * encoder_forward_flops(cfg, length) + projections)


def _pair(seed=0) -> DebertaPair:
    torch.manual_seed(seed)
    pair = DebertaPair(preset("deberta_v3_tiny", vocab_size=VOCAB))
    with torch.no_grad():  # as after training: E_Delta no longer zero
        pair.discriminator.deberta.embeddings.word_embeddings.delta.normal_(std=0.02)
    return pair


def test_export_loads_in_transformers_with_equal_outputs(tmp_path):
    pair = _pair().eval()
    hf.export_pair(pair, tmp_path / "hf")
    ids, types, mask = _inputs()
    real = mask.bool()
    encoder = transformers.AutoModel.from_pretrained(str(tmp_path / "hf"), torch_dtype=torch.float32).eval()
    generator = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf" / "generator"),
                                                                  torch_dtype=torch.float32).eval()
    assert type(encoder).__name__ == "DebertaV2Model" and type(generator).__name__ == "DebertaV2ForMaskedLM"
    words = pair.generator.deberta.embeddings.word_embeddings.weight
    _close(encoder.embeddings.word_embeddings.weight,
           words + pair.discriminator.deberta.embeddings.word_embeddings.delta)  # E_G + E_Delta
    with torch.no_grad():
        hidden, _ = pair.discriminator.deberta(ids, types, mask)
        _close(encoder(input_ids=ids, attention_mask=mask).last_hidden_state[real], hidden[real])
        _close(generator(input_ids=ids, attention_mask=mask).logits[real], pair.generator(ids, types, mask)[real])
        ours = hf.load_encoder(tmp_path / "hf").eval()
        _close(ours(ids, types, mask)[0][real], hidden[real])


def test_load_pair_recovers_the_pair_and_its_residual(tmp_path):
    pair = _pair()
    hf.export_pair(pair, tmp_path / "hf")
    loaded, fresh = hf.load_pair(tmp_path / "hf")
    assert fresh == []
    theirs = dict(loaded.state_dict())
    for key, value in pair.state_dict().items():
        _close(theirs[key], value)
    hf.export_discriminator(pair, tmp_path / "alone")  # Microsoft's releases: no generator
    loaded, fresh = hf.load_pair(tmp_path / "alone")
    assert len(fresh) == 1 and "generator" in fresh[0]
    _close(loaded.discriminator.deberta.embeddings.word_embeddings.weight,
           pair.discriminator.deberta.embeddings.word_embeddings.weight)
    assert not loaded.discriminator.deberta.embeddings.word_embeddings.delta.any()


def test_a_deberta_v2_xlarge_config_is_refused_in_one_line(tmp_path):
    hf.export_discriminator(_pair(), tmp_path / "hf")
    config = (tmp_path / "hf" / "config.json")
    config.write_text(config.read_text().replace('"hidden_act"', '"conv_kernel_size": 3, "hidden_act"'))
    with pytest.raises(CheckpointError, match="conv_kernel_size or an embedding_size other than hidden_size"):
        hf.load_encoder(tmp_path / "hf")
