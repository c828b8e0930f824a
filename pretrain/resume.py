"""Whether a run may continue from a checkpoint under the config it is started with now.

A checkpoint records the resolved config it was written under, the dataset's identity and the vocabulary's
hash. On resume every setting that differs is sorted into one of two kinds:

* **applied from the resumed step on** (and logged): the learning rate and schedule, the optimizer's
  hyperparameters, the step budget and micro-batch split, checkpoint cadence, logging, fault limits,
  where the output and the dataset live, and the loss-scaler settings;
* **refused**, all differences in one line: everything the saved state depends on — the model's shape,
  the global batch, the seed, the ZeRO stage and offload layout, the optimizer kind, the sample order
  (length-grouping window), the dataset itself (its manifest's shard hashes) and its vocabulary.

The precision (``train.precision``, as ``auto`` resolved on the machine that wrote the checkpoint) may change at
ZeRO 1-3: the checkpoint then loads through DeepSpeed's universal format, whose fp32 weights and optimizer moments
do not depend on the precision a step computes in (``pretrain.train``). At ZeRO 0 it is refused: there the
optimizer's file is the precision's own (fp16's loss-scaled master copies, none in fp32).

A setting not listed as applicable is refused, so a new config key is safe until someone decides otherwise.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from common.manifest import Manifest

# Settings a resumed run takes from its new config: none of them is baked into the saved state.
APPLIED_FROM_RESUME = (
    "output_dir", "data.path", "data.verify", "data.pad_multiple",  # the padding only: the same rows and losses
    "train.max_steps", "train.micro_batch_size", "train.gradient_clipping", "train.initial_scale_power",
    "train.loss_scale_window", "train.hysteresis", "train.min_loss_scale",
    "optimizer.lr", "optimizer.betas", "optimizer.eps", "optimizer.weight_decay", "optimizer.torch_adam",
    "schedule.", "checkpoint.", "eval.", "faults.", "logging.", "model.activation_checkpointing", "model.init_from",
    "model.padding_free",  # how the same step is computed (equal to rounding), not what it computes
    "model.compile", "model.compile_cuda_graphs", "model.compile_cache",  # likewise (pretrain.compiling: in place,
                                                                           # the checkpoint's names unchanged)
    "distillation.teacher_precision",  # how the frozen teacher's forward is computed; nothing of it is saved
)


# Settings added after checkpoints were first written, with the value that reproduces what those checkpoints
# did: a checkpoint that does not record one was written under this value.
ADDED_LATER = {"objective.masking": "static", "objective.sentence_objective": "nsp", "objective.attention": "full",
               "objective.mask_unit": None, "objective.masked_lm_prob": None, "objective.max_predictions": None,
               "data.pad_multiple": 8, "objective.span_boundary": False,
               # TinyBERT's loss beside DistilBERT's: a checkpoint from before distilled with DistilBERT's
               "distillation.loss": "distilbert", "distillation.embedding_weight": 1.0,
               "distillation.hidden_weight": 1.0, "distillation.attention_weight": 1.0,
               "distillation.prediction_weight": 0.0, "distillation.layer_map": None,
               "distillation.student_hidden_size": None, "distillation.student_intermediate_size": None,
               "distillation.student_attention_heads": None}


PRECISION = "train.precision"
PRECISION_AT_ZERO_0 = ("at ZeRO stage 0 the optimizer's checkpoint is specific to its precision, so this one resumes "
                       "only in {saved}: set train.precision: {saved}")


class ResumeError(ValueError):
    """The checkpoint cannot continue under the new config."""


@dataclass(frozen=True)
class Difference:
    key: str
    saved: object
    now: object

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.saved)} -> {_show(self.now)}"


def dataset_identity(manifest: Manifest) -> dict:
    """What names a dataset whatever its path: a hash of its shards' names and sha256 values, and its vocabulary."""
    shards = [[entry.name, entry.sha256] for entry in manifest.shards]
    digest = hashlib.sha256(json.dumps(shards, separators=(",", ":")).encode()).hexdigest()
    return {"dataset.shards_sha256": digest, "dataset.vocab_sha256": manifest.tokenizer.vocab_sha256}


def flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def compare(saved: dict, now: dict) -> tuple[list[Difference], list[Difference]]:
    """(refused, applied) differences between two flattened settings dictionaries."""
    refused, applied = [], []
    for key in sorted(set(saved) | set(now)):
        before, after = saved.get(key, ADDED_LATER.get(key)), now.get(key)
        if before == after:
            continue
        (applied if _applicable(key, saved, now) else refused).append(Difference(key, before, after))
    return refused, applied


def precision_changed(saved: dict, now: dict) -> bool:
    """Whether the run computes in another precision than the checkpoint's (allowed at ZeRO 1-3 only)."""
    return saved.get(PRECISION) != now.get(PRECISION)


def check(saved_settings: dict, now_settings: dict, checkpoint: str) -> list[Difference]:
    """Raise ``ResumeError`` naming every difference the checkpoint cannot take; the applied ones otherwise."""
    refused, applied = compare(saved_settings, now_settings)
    if refused:
        why = [PRECISION_AT_ZERO_0.format(saved=d.saved) for d in refused if d.key == PRECISION]
        raise ResumeError(f"{checkpoint} cannot continue under this config: " + "; ".join(map(str, refused)) +
                          (f" ({why[0]})" if why else "") + ". Put these settings back, or start a new run "
                          "(output_dir) from its weights (model.init_from)")
    return applied


def _applicable(key: str, saved: dict, now: dict) -> bool:
    if key == PRECISION:  # see the module's docstring
        return saved.get("zero.stage") == now.get("zero.stage") and bool(now.get("zero.stage"))
    return any(key == name or (name.endswith(".") and key.startswith(name)) for name in APPLIED_FROM_RESUME)


def _show(value: object) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    return "(not set)" if value is None else json.dumps(value) if not isinstance(value, str) else value


__all__ = ["ADDED_LATER", "APPLIED_FROM_RESUME", "Difference", "PRECISION", "ResumeError", "check", "compare",
           "dataset_identity", "flatten", "precision_changed"]
