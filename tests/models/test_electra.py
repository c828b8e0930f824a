"""ELECTRA: generator and discriminator against transformers, the shared embeddings, the replaced-token objective,
the FLOP count and the Hugging Face export."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from common.errors import CheckpointError
from models.bert.model import Unpadding
from models.electra import hf as electra_hf
from models.electra.model import (
    ElectraConfig,
    ElectraDiscriminator,
    ElectraGenerator,
    ElectraModel,
    ElectraPair,
    ElectraPairConfig,
    flops_per_token,
    generator_config,
    preset,
)
from pretrain.families.electra_loss import STAT_NAMES, ElectraLoss, corrupt, sample_replacements, summary

VOCAB = 120
SIZES = dict(vocab_size=VOCAB, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _inputs(batch=3, length=20, vocab=VOCAB):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (batch, length), generator=gen)
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    mask = torch.ones_like(ids)
    mask[0, -5:] = 0  # a padded row
    ids[0, -5:] = 0
    return ids, types, mask


def _masked_batch(mask_id=4):
    """A (3, 20) batch with every 4th real token masked: (ids, types, attention mask, flat positions, labels)."""
    ids, types, mask = _inputs()
    positions = torch.nonzero(mask.reshape(-1)).squeeze(1)[1::4]
    labels = ids.reshape(-1)[positions].clone()
    ids.reshape(-1)[positions] = mask_id
    return ids, types, mask, positions, labels


def _stat(stats, name):
    return float(stats[STAT_NAMES.index(name)])


def _pair(seed=0, **overrides) -> ElectraPair:
    torch.manual_seed(seed)
    return ElectraPair(preset("electra_tiny", vocab_size=VOCAB, max_position_embeddings=64, **overrides))


@pytest.mark.parametrize("embedding_size", [32, 64])  # projected to the hidden size 64, and not
def test_discriminator_and_generator_match_transformers(embedding_size):
    torch.manual_seed(0)
    hf_cfg = transformers.ElectraConfig(embedding_size=embedding_size, hidden_size=64, **SIZES)
    ours_cfg = ElectraConfig(embedding_size=embedding_size, hidden_size=64, **SIZES)
    ids, types, mask = _inputs()
    for hf_cls, ours_cls in ((transformers.ElectraForPreTraining, ElectraDiscriminator),
                             (transformers.ElectraForMaskedLM, ElectraGenerator)):
        hf, ours = hf_cls(hf_cfg).eval(), ours_cls(ours_cfg).eval()
        assert sorted(ours.state_dict()) == sorted(hf.state_dict())  # name for name
        ours.load_state_dict(hf.state_dict())
        with torch.no_grad():
            expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
            _close(ours(ids, types, mask), expected)  # padded positions too: both mask keys only
    flat = torch.tensor([3, 17, 25, 41])  # the generator (the loop's last) on masked positions only
    with torch.no_grad():
        _close(ours(ids, types, mask, masked_positions=flat), expected.reshape(-1, VOCAB)[flat])


def test_padding_free_encoder_equals_padded():
    encoder = _pair().discriminator.electra.eval()
    ids, types, mask = _inputs()
    unpadding = Unpadding.from_attention_mask(mask)
    with torch.no_grad():
        padded, _ = encoder(ids, types, mask)
        free, _ = encoder(unpadding.unpad(ids), unpadding.unpad(types), unpadding=unpadding)
    _close(free, padded[mask.bool()])


def test_packed_documents_kept_apart_are_encoded_as_if_alone():
    """document_ids (attention within a document) and position_ids (restarting per document) reach both networks:
    a row holding two documents gives each document's outputs alone, in padded and in padding-free mode."""
    pair = _pair().eval()
    first, second = torch.randint(5, VOCAB, (1, 7)), torch.randint(5, VOCAB, (1, 9))
    row = torch.cat([first, second], dim=1)
    documents = {"document_ids": torch.tensor([[0] * 7 + [1] * 9]),
                 "position_ids": torch.cat([torch.arange(7), torch.arange(9)])[None]}
    types, mask = torch.zeros_like(row), torch.ones_like(row)
    unpadding = Unpadding.from_attention_mask(mask)
    with torch.no_grad():
        alone = torch.cat([pair.discriminator(first), pair.discriminator(second)], dim=1)
        _close(pair.discriminator(row, types, mask, **documents), alone)
        hidden, _ = pair.discriminator.electra(unpadding.unpad(row), unpadding.unpad(types), unpadding=unpadding,
                                               **{k: unpadding.unpad(v) for k, v in documents.items()})
        _close(pair.discriminator.discriminator_predictions(hidden), alone[0])
        alone = torch.cat([pair.generator(first), pair.generator(second)], dim=1)
        _close(pair.generator(row, types, mask, **documents), alone)


def test_presets_are_the_papers_sizes():
    small, base = preset("electra_small"), preset("electra_base")
    sizes = lambda c: (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,  # noqa: E731
                       c.embedding_size)
    assert sizes(small.discriminator) == (256, 12, 4, 1024, 128) and sizes(small.generator) == (64, 12, 1, 256, 128)
    assert sizes(base.discriminator) == (768, 12, 12, 3072, 768) and sizes(base.generator) == (256, 12, 4, 1024, 768)
    assert preset("electra_small", vocab_size=1000).generator.vocab_size == 1000
    assert preset("electra_base", generator_fraction=0.5).generator.hidden_size == 384


def test_configs_that_cannot_share_embeddings_are_refused():
    disc = ElectraConfig(**SIZES, embedding_size=32, hidden_size=64)
    with pytest.raises(ValueError, match="embedding_size"):
        ElectraPairConfig(discriminator=disc, generator=dataclasses.replace(disc, embedding_size=16))
    with pytest.raises(ValueError, match="outside"):
        generator_config(disc, 1.5)
    with pytest.raises(ValueError, match="electra_small"):
        preset("electra_huge")
    with pytest.raises(ValueError, match="multiple"):
        ElectraConfig(hidden_size=64, num_attention_heads=5)


def test_embeddings_are_one_module_that_both_losses_train():
    pair = _pair()
    gen, disc = pair.generator, pair.discriminator
    assert disc.electra.embeddings is gen.electra.embeddings
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    assert disc.electra.embeddings_project is not gen.electra.embeddings_project  # each encoder its own width
    objective = ElectraLoss(pair).eval()
    batch = _masked_batch()
    table = pair.embeddings.word_embeddings.weight
    objective.terms(*batch, sample_seed=0).generator_loss.backward()
    assert table.grad is not None and table.grad.abs().sum() > 0
    objective.zero_grad(set_to_none=True)
    objective.terms(*batch, sample_seed=0).discriminator_loss.backward()
    assert table.grad is not None and table.grad.abs().sum() > 0
    # The discriminator's loss reaches the shared embeddings, never the generator's own layers (sampling has no
    # gradient): all of the generator's parameters but the shared ones are untouched.
    shared = {id(p) for p in pair.embeddings.parameters()}
    assert all(p.grad is None for p in gen.parameters() if id(p) not in shared)


def test_replaced_labels_count_a_sample_equal_to_the_original_as_original():
    ids = torch.tensor([[2, 4, 7, 4, 3], [2, 4, 9, 3, 0]])
    positions, labels = torch.tensor([1, 3, 6]), torch.tensor([11, 12, 13])
    corrupted, replaced = corrupt(ids, positions, labels, sampled=torch.tensor([11, 5, 6]))
    assert corrupted.tolist() == [[2, 11, 7, 5, 3], [2, 6, 9, 3, 0]]
    assert replaced.tolist() == [[False, False, False, True, False], [False, True, False, False, False]]


def test_a_generator_that_samples_the_originals_replaces_nothing():
    pair = _pair()
    ids, types, mask, positions, _ = _masked_batch()
    labels = torch.full_like(positions, 7)
    with torch.no_grad():
        pair.generator.generator_lm_head.bias[7] = 100.0  # every sample is token 7, the original
    _, stats = ElectraLoss(pair).eval()(ids, types, mask, positions, labels, sample_seed=3)
    assert _stat(stats, "replaced_tokens") == 0 and _stat(stats, "mlm_correct") == len(positions)
    assert _stat(stats, "disc_tokens") == mask.sum()


def test_samples_follow_the_generators_distribution_and_the_seed():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    logits = probs.log().expand(20000, 4)
    draws = sample_replacements(logits, seed=5)
    frequencies = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(frequencies, probs, atol=0.015, rtol=0)
    assert frequencies[1] == 0  # a token of probability 0 is never drawn
    assert torch.equal(sample_replacements(logits, seed=5), draws)
    assert not torch.equal(sample_replacements(logits, seed=6), draws)


def test_loss_is_generator_mlm_plus_50_times_discriminator_bce():
    pair = _pair().eval()
    ids, types, mask, positions, labels = _masked_batch()
    loss, stats = ElectraLoss(pair)(ids, types, mask, positions, labels, sample_seed=11)
    with torch.no_grad():  # the same losses from the two networks by hand
        gen_logits = pair.generator(ids, types, mask, positions)
        gen = torch.nn.functional.cross_entropy(gen_logits, labels)
        sampled = sample_replacements(gen_logits, 11)
        shown = ids.reshape(-1).clone()
        shown[positions] = sampled
        target = torch.zeros(ids.numel())
        target[positions] = (sampled != labels).float()
        disc_logits = pair.discriminator(shown.view_as(ids), types, mask)
        real = mask.bool().reshape(-1)
        disc = torch.nn.functional.binary_cross_entropy_with_logits(disc_logits.reshape(-1)[real], target[real])
    _close(loss, gen + 50 * disc)
    assert _stat(stats, "replaced_tokens") == target.sum() > 0
    _close(torch.tensor(summary(stats)["loss"]), loss)


def test_objective_is_deterministic_given_the_seed():
    objective = ElectraLoss(_pair()).eval()
    batch = _masked_batch()
    first, again, other = (objective(*batch, sample_seed=seed) for seed in (1, 1, 2))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_a_few_steps_lower_the_loss():
    objective = ElectraLoss(_pair(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    optimizer = torch.optim.AdamW(objective.parameters(), lr=2e-3)
    batch = _masked_batch()
    losses = []
    for step in range(12):
        loss, _ = objective(*batch, sample_seed=step % 2)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0], losses


def test_flops_per_token_counts_the_pairs_training_matmuls():
    cfg = preset("electra_tiny", vocab_size=VOCAB, max_position_embeddings=64)
    objective = ElectraLoss(ElectraPair(cfg))
    ids, types = torch.randint(5, VOCAB, (2, 16)), torch.zeros(2, 16, dtype=torch.long)
    positions = torch.arange(0, 32, 4)
    with FlopCounterMode(display=False) as counter:
        loss, _ = objective(ids, types, torch.ones_like(ids), positions, ids.reshape(-1)[positions], sample_seed=0)
        loss.backward()
    assert counter.get_total_flops() == pytest.approx(flops_per_token(cfg, 16, masked_fraction=8 / 32) * 32, rel=1e-9)


def test_export_loads_in_transformers_with_equal_outputs(tmp_path, bert_vocab):
    from common.tokenizer import load_tokenizer

    load_tokenizer(str(bert_vocab)).save(str(tmp_path / "tok"))
    pair = _pair(seed=3).eval()
    electra_hf.export_discriminator(pair, tmp_path / "disc", tokenizer_dir=tmp_path / "tok")
    electra_hf.export_generator(pair, tmp_path / "gen")
    assert not (tmp_path / "disc.partial").exists()
    ids, types, mask = _inputs()
    real = mask.bool()
    with torch.no_grad():
        disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "disc").eval()
        expected = pair.discriminator(ids, types, mask)
        _close(disc(input_ids=ids, token_type_ids=types, attention_mask=mask).logits, expected)
        encoder = transformers.AutoModel.from_pretrained(tmp_path / "disc").eval()
        assert isinstance(encoder, transformers.ElectraModel)
        hidden, _ = pair.discriminator.electra(ids, types, mask)
        _close(encoder(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state[real], hidden[real])
        gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
        _close(gen(input_ids=ids, token_type_ids=types, attention_mask=mask).logits, pair.generator(ids, types, mask))
        loaded = electra_hf.load_discriminator(tmp_path / "disc").eval()
        assert isinstance(loaded, ElectraModel) and loaded.config == pair.config.discriminator
        _close(loaded(ids, types, mask)[0], hidden)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "disc").tokenize("Unaffable") == \
        transformers.BertTokenizer(str(bert_vocab)).tokenize("Unaffable")


def test_load_discriminator_reads_a_transformers_checkpoint_and_refuses_others(tmp_path):
    torch.manual_seed(0)
    hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(embedding_size=32, hidden_size=64, **SIZES))
    hf.save_pretrained(tmp_path / "hf")
    ids, types, mask = _inputs()
    with torch.no_grad():
        _close(electra_hf.load_discriminator(tmp_path / "hf").eval()(ids, types, mask)[0],
               hf.eval().electra(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state)
    transformers.BertModel(transformers.BertConfig(**SIZES, hidden_size=64)).save_pretrained(tmp_path / "bert")
    with pytest.raises(CheckpointError, match="not 'electra'"):
        electra_hf.load_discriminator(tmp_path / "bert")


def test_non_finite_weights_are_refused(tmp_path):
    pair = _pair()
    with torch.no_grad():
        pair.discriminator.electra.encoder.layer[1].output.dense.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="NaN or inf"):
        electra_hf.export_discriminator(pair, tmp_path / "disc")
    assert not (tmp_path / "disc").exists() and not (tmp_path / "disc.partial").exists()
    electra_hf.export_generator(pair, tmp_path / "gen")  # the generator does not hold that layer
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "gen" / "model.safetensors"))
    state["electra.embeddings.LayerNorm.weight"][0] = float("inf")
    save_file(state, str(tmp_path / "gen" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="NaN or inf"):
        electra_hf.load_discriminator(tmp_path / "gen")


def test_the_pair_is_published_whole_or_not_at_all(tmp_path, monkeypatch):
    """export_pair stages the discriminator and generator/ in one directory and renames it once: a generator write
    that fails leaves no export, or the earlier one untouched, never a discriminator without its generator."""
    from models import hf_io
    from pretrain import checkpoints

    real_write, target = hf_io._write_files, tmp_path / "hf"  # tmp_path stands for the run directory

    def failing_generator(directory, *args):
        if directory.name == electra_hf.GENERATOR:
            raise RuntimeError("killed while writing the generator")
        real_write(directory, *args)

    def files() -> dict:
        return {path.relative_to(target): path.read_bytes() for path in target.rglob("*") if path.is_file()}

    monkeypatch.setattr(hf_io, "_write_files", failing_generator)
    with pytest.raises(RuntimeError, match="killed while writing the generator"):
        electra_hf.export_pair(_pair(seed=3), target)
    assert not target.exists() and checkpoints.finished_export(tmp_path) is None
    monkeypatch.setattr(hf_io, "_write_files", real_write)
    electra_hf.export_pair(_pair(seed=3), target)
    assert hf_io.is_complete(target / electra_hf.GENERATOR) and checkpoints.finished_export(tmp_path) == target
    assert electra_hf.load_pair(target)[1] == []  # both networks read back
    before = files()
    monkeypatch.setattr(hf_io, "_write_files", failing_generator)
    with pytest.raises(RuntimeError, match="killed while writing the generator"):
        electra_hf.export_pair(_pair(seed=4), target)
    assert files() == before
    # An export cut short by the older two-step writer (the discriminator alone) is no finished run export.
    (target / electra_hf.GENERATOR / "model.safetensors").unlink()
    assert hf_io.is_complete(target) and checkpoints.finished_export(tmp_path) is None
