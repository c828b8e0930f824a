"""DeBERTa-v3's replaced-token-detection loss around a ``DebertaPair``: ELECTRA's objective, with the embeddings
shared by GDES instead of outright.

loss = generator MLM + ``discriminator_weight`` x the discriminator's binary cross-entropy over every real token (50,
the paper's lambda, as ELECTRA's); samples, corruption, statistics and the loader's scaling are
``pretrain.families.electra_loss``'s. What differs lives in the model: the discriminator looks its tokens up in
``stop_gradient(E_G) + E_Delta`` (``models.deberta_v2.model.GdesWordEmbedding``), so its loss sends no gradient into
the generator's table E_G, which learns from the MLM loss alone, and trains E_Delta instead.
"""
from __future__ import annotations

from models.deberta_v2.pair import DebertaPair
from pretrain.families.electra import ElectraPretrainingLoss
from pretrain.families.electra_loss import DISCRIMINATOR_WEIGHT, STAT_NAMES, summary


class DebertaPretrainingLoss(ElectraPretrainingLoss):
    """``ElectraPretrainingLoss`` (the loader's micro-batch in, (loss, statistics) out) on a ``DebertaPair``."""

    def __init__(self, model: DebertaPair, discriminator_weight: float = DISCRIMINATOR_WEIGHT):
        super().__init__(model, discriminator_weight)


__all__ = ["DISCRIMINATOR_WEIGHT", "DebertaPretrainingLoss", "STAT_NAMES", "summary"]
