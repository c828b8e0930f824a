"""A BERT distilled from a larger BERT (DistilBERT, Sanh et al. 2019) as a ``Family``: ``distillation.teacher`` set.

The teacher is any BERT this pipeline loads: a Hugging Face BERT directory or one of our run directories (its
finished export). The student is the teacher's architecture (width, heads, FFN, vocabulary, positions) with
``distillation.student_layers`` layers (default: half), initialised from the teacher: its embeddings, pooler and
heads, and teacher layers 0, s, 2s, ... for stride s = teacher layers / student layers, i.e. every other layer at
the default half (0, 2, 4, 6, 8, 10 of BERT-base; DistilBERT's extraction script took 0, 2, 4, 7, 9, 11, keeping
the top layer). ``model.preset`` is not used. The loss is ``distillation_loss``'s (``distillation.loss: distilbert``)
or ``tinybert_loss``'s (``tinybert``: TinyBERT's general distillation). A student of another width, FFN or head
count (``distillation.student_hidden_size`` ...; TinyBERT-4 is 312 wide) cannot take the teacher's layers: it
starts from BERT's initialisation, drawn from a seed that is a stable hash of the run's seed.

Every rank loads the teacher; it is never trained, checkpointed or partitioned (it is no parameter of the module
DeepSpeed wraps) and runs in ``distillation.teacher_precision`` (``auto``: ``pretrain.precision``). Resuming needs the
same teacher: its path is in the run's recorded settings (``pretrain.resume``: a changed one is refused) and the
sha256 of its weights file in ``<output_dir>/teacher.json``, checked when a run with checkpoints starts again.
Export, finetuning and ``pretrain.export`` see the student as a plain BERT; the record also holds a copy of the
teacher's config.json, from which ``pretrain.export`` derives the student's config, so exporting a checkpoint does
not need the teacher where it was.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from common import storage
from common.errors import CheckpointError
from models.bert.hf import load_config, load_pretrained
from models.bert.model import BertConfig, BertForPreTraining, count_parameters, flops_per_token
from models.hf_io import config_from_dict, weights_file
from pretrain import precision
from pretrain.checkpoints import finished_export
from pretrain.config import DistillationConfig, ModelConfig
from pretrain.families import tinybert_loss
from pretrain.families.bert import BertFamily
from pretrain.families.distillation_loss import STAT_NAMES, DistillationLoss, Weights

RECORD_NAME = "teacher.json"  # in output_dir: which teacher the run's checkpoints were distilled from


def teacher_directory(teacher: str) -> Path:
    """``distillation.teacher`` may name one of our run directories; its finished Hugging Face export is used."""
    return finished_export(teacher) or Path(teacher)


def recorded_teacher_config(run_directory: str | Path) -> BertConfig | None:
    """The teacher's config as the run recorded it in ``teacher.json`` when it started, or None (no record, or one
    from before records held the config)."""
    record = Path(run_directory) / RECORD_NAME
    if not record.is_file():
        return None
    raw = json.loads(record.read_text()).get("config")
    return None if raw is None else config_from_dict(raw, record, "bert", BertConfig)


def student_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layer each student layer starts from: 0, s, 2s, ... with s = teacher / student layers."""
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(f"distillation.student_layers is {student_layers}; the teacher has {teacher_layers} layers "
                         f"(choose 1 to {teacher_layers})")
    return [i * teacher_layers // student_layers for i in range(student_layers)]


def student_state(teacher: dict[str, torch.Tensor], layers: list[int]) -> dict[str, torch.Tensor]:
    """The student's weights from the teacher's state dict: every non-layer tensor as is, student layer i from
    teacher layer ``layers[i]``."""
    prefix, state = "bert.encoder.layer.", {}
    for key, value in teacher.items():
        if not key.startswith(prefix):
            state[key] = value
    for student_index, teacher_index in enumerate(layers):
        source = f"{prefix}{teacher_index}."
        for key, value in teacher.items():
            if key.startswith(source):
                state[f"{prefix}{student_index}.{key[len(source):]}"] = value
    return state


def student_seed(seed: int) -> int:
    """The seed of a from-scratch student's initialisation: a stable hash of the run's seed."""
    return int.from_bytes(hashlib.blake2b(f"distillation-student/{seed}".encode(), digest_size=8).digest(),
                          "little") >> 1


def tinybert_summary(stats: torch.Tensor, settings: DistillationConfig, sentence_objective: str) -> dict[str, float]:
    """``loss`` (the weighted terms, each a token mean, plus the pair loss), each term, the student's MLM loss and
    accuracy (logged, not trained), its agreement with the teacher (with the prediction term) and the pair head's."""
    s = dict(zip(tinybert_loss.STAT_NAMES, stats.tolist()))
    masked, tokens, w = max(1.0, s["mlm_tokens"]), max(1.0, s["tokens"]), settings
    terms = {"embedding_loss": s["embedding_loss_sum"] / tokens, "hidden_loss": s["hidden_loss_sum"] / tokens,
             "attention_loss": s["attention_loss_sum"] / tokens, "prediction_loss": s["prediction_loss_sum"] / masked}
    pair = s["pair_loss_sum"] / max(1.0, s["pair_sequences"])
    record = {"loss": (w.embedding_weight * terms["embedding_loss"] + w.hidden_weight * terms["hidden_loss"]
                       + w.attention_weight * terms["attention_loss"] + w.prediction_weight * terms["prediction_loss"]
                       + pair), **terms,
              "mlm_loss": s["mlm_loss_sum"] / masked, "mlm_accuracy": s["mlm_correct"] / masked}
    if w.prediction_weight > 0:
        record["teacher_agreement"] = s["agreement"] / masked
    if sentence_objective != "none" and s["pair_sequences"] > 0:
        record[f"{sentence_objective}_loss"] = pair
        record[f"{sentence_objective}_accuracy"] = s["pair_correct"] / s["pair_sequences"]
    return record


def weights_sha256(directory: Path) -> tuple[str, str]:
    """(weights file name, its sha256): what names a teacher whatever its path."""
    path = weights_file(directory)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return path.name, digest.hexdigest()


class DistillationFamily(BertFamily):
    name = "distillation"
    stat_names = STAT_NAMES
    architecture = "BertForPreTraining"

    def __init__(self, model: ModelConfig, sentence_objective: str, distillation: DistillationConfig, data_path: str,
                 output_dir: Path, recorded_in: Path | None = None, seed: int = 0):
        """``recorded_in``: a run directory whose checkpoints are read back; its record's teacher config is used
        (``families.for_config``). ``seed``: the run's, for a student or projections that start from scratch."""
        super().__init__(model, sentence_objective)
        self.settings = distillation
        self.seed = seed
        self.tinybert = distillation.loss == "tinybert"
        self.stat_names = tinybert_loss.STAT_NAMES if self.tinybert else STAT_NAMES
        if self.tinybert and model.padding_free:
            raise ValueError("model.padding_free is not implemented for distillation.loss tinybert (its attention "
                             "scores are computed on the padded grid); set it to false")
        self.data_path = data_path
        self.output_dir = Path(output_dir)
        self.teacher_dir = teacher_directory(distillation.teacher)
        recorded = None if recorded_in is None else recorded_teacher_config(recorded_in)
        if recorded is None and not (self.teacher_dir / "config.json").is_file():
            older = "" if recorded_in is None else (f" and {Path(recorded_in) / RECORD_NAME} holds no copy of it (a "
                                                    "run from before runs recorded it)")
            raise CheckpointError(f"distillation.teacher {distillation.teacher}: no config.json (nor a finished "
                                  f"run's hf/ export) there{older}; set it to a Hugging Face BERT directory or one of "
                                  "our run directories")
        self.teacher_config = recorded or load_config(self.teacher_dir)
        layers = self.teacher_config.num_hidden_layers
        self.layers = student_layer_map(layers, self.settings.student_layers or max(1, layers // 2))
        if self.tinybert:  # the teacher layers the student's layers fit (1-based): refused here if out of range
            self.fitted = tinybert_loss.tinybert_layer_map(layers, len(self.layers), distillation.layer_map)
        elif self.student_config().hidden_size != self.teacher_config.hidden_size:
            raise ValueError(f"distillation.loss distilbert compares the last hidden states by their cosine: "
                             f"distillation.student_hidden_size must be the teacher's {self.teacher_config.hidden_size}"
                             " (or use distillation.loss: tinybert, which projects them)")
        self._teacher: BertForPreTraining | None = None

    @classmethod
    def from_config(cls, cfg, recorded_in: Path | None = None) -> DistillationFamily:
        return cls(cfg.model, cfg.objective.sentence_objective, cfg.distillation, cfg.data.path, Path(cfg.output_dir),
                   recorded_in=recorded_in, seed=cfg.seed)

    def student_config(self) -> BertConfig:
        """The teacher's config with the student's depth, width, FFN and heads (and the run's dropout overrides)."""
        s, t = self.settings, self.teacher_config
        return replace(t, num_hidden_layers=len(self.layers), hidden_size=s.student_hidden_size or t.hidden_size,
                       intermediate_size=s.student_intermediate_size or t.intermediate_size,
                       num_attention_heads=s.student_attention_heads or t.num_attention_heads,
                       **self.model_cfg.dropout_overrides())

    def from_teacher_layers(self) -> bool:
        """Whether the student has the teacher's shape (but depth), so starts from its layers."""
        ours, theirs = self.student_config(), self.teacher_config
        return all(getattr(ours, k) == getattr(theirs, k)
                   for k in ("hidden_size", "intermediate_size", "num_attention_heads"))

    def teacher(self) -> BertForPreTraining:
        """The frozen teacher (CPU, fp32, eval mode), loaded once and checked against the dataset's vocabulary and
        the loss: soft targets need the teacher's MLM head."""
        if self._teacher is None:
            self._check_vocabulary()
            model, fresh = load_pretrained(self.teacher_dir)
            s = self.settings
            weight = "prediction_weight" if self.tinybert else "kl_weight"
            if getattr(s, weight) > 0 and any(k.startswith("cls.predictions.") for k in fresh):
                raise CheckpointError(f"{self.teacher_dir} has no masked-LM head (an encoder-only checkpoint), so its "
                                      f"soft targets would be random: set distillation.{weight}=0 (no soft targets), "
                                      "or give a teacher with its MLM head (e.g. a run's export)")
            self._teacher = model.eval().requires_grad_(False)
        return self._teacher

    def new_model(self, *, vocab_size: int, pad_token_id: int) -> BertForPreTraining:
        """The student initialised from the teacher (module docstring); on the meta device (the memory plan) its
        shape only. The teacher's vocabulary is the student's whatever ``vocab_size`` says (they share logits)."""
        del vocab_size, pad_token_id
        if torch.empty(0).device.type == "meta":
            return BertForPreTraining(self.student_config())
        if not self.from_teacher_layers():
            self.teacher()  # the vocabulary check
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(student_seed(self.seed))
                return BertForPreTraining(self.student_config())
        student = BertForPreTraining(self.student_config())
        state = student_state(self.teacher().state_dict(), self.layers)
        missing = student.load_state_dict(state, strict=False).missing_keys
        if set(missing) - {"cls.predictions.decoder.weight"}:
            raise CheckpointError(f"{self.teacher_dir}: the student could not take {sorted(missing)[:3]} from it")
        return student

    def loss_module(self, model: nn.Module) -> nn.Module:
        self._check_record()
        s = self.settings
        if self.tinybert:
            weights = tinybert_loss.Weights(s.temperature, s.embedding_weight, s.hidden_weight, s.attention_weight,
                                            s.prediction_weight)
            return tinybert_loss.TinyBertLoss(model, self.teacher(), weights, self.fitted, seed=self.seed,
                                              sentence_objective=self.sentence_objective,
                                              teacher_dtype=self.teacher_dtype())
        return DistillationLoss(model, self.teacher(), Weights(s.temperature, s.kl_weight, s.mlm_weight,
                                                                    s.cosine_weight),
                                     sentence_objective=self.sentence_objective, padding_free=self.padding_free,
                                     teacher_dtype=self.teacher_dtype())

    def teacher_dtype(self) -> torch.dtype:
        """``distillation.teacher_precision`` as the run resolved it; ``auto`` left unresolved (a memory plan, say)
        is resolved here for this machine's device."""
        chosen = self.settings.teacher_precision
        if chosen == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
            chosen = precision.choose(chosen, precision.detect(device), what="distillation.teacher_precision").precision
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[chosen]

    def summary(self, stats: torch.Tensor) -> dict[str, float]:
        """The weighted loss and each term (token means, ``kl_loss`` with its T^2), the student's MLM accuracy, its
        top-1 agreement with the teacher on the masked tokens, and the pair head's metrics when it trains one."""
        if self.tinybert:
            return tinybert_summary(stats, self.settings, self.sentence_objective)
        s = dict(zip(STAT_NAMES, stats.tolist()))
        masked, tokens, w = max(1.0, s["mlm_tokens"]), max(1.0, s["tokens"]), self.settings
        mlm, kl, cosine = s["mlm_loss_sum"] / masked, s["kl_loss_sum"] / masked, s["cosine_loss_sum"] / tokens
        pair = s["pair_loss_sum"] / max(1.0, s["pair_sequences"])
        record = {"loss": w.kl_weight * kl + w.mlm_weight * mlm + w.cosine_weight * cosine + pair,
                  "mlm_loss": mlm, "mlm_accuracy": s["mlm_correct"] / masked, "kl_loss": kl, "cosine_loss": cosine,
                  "teacher_agreement": s["agreement"] / masked}
        if self.sentence_objective != "none" and s["pair_sequences"] > 0:
            record[f"{self.sentence_objective}_loss"] = pair
            record[f"{self.sentence_objective}_accuracy"] = s["pair_correct"] / s["pair_sequences"]
        return record

    def flops_per_token(self, model: nn.Module, seq_len: int, masked_fraction: float) -> float:
        """The student's training FLOPs plus the teacher's forward (a third of BERT's training count)."""
        return (flops_per_token(model.config, seq_len, masked_fraction=masked_fraction)
                + flops_per_token(self.teacher_config, seq_len, masked_fraction=masked_fraction) / 3.0)

    def loss_parameters(self, model_config) -> int:
        """TinyBERT's W_h and W_e, each a student-width to teacher-width linear map (none where the widths agree:
        ``tinybert_loss.Projections``)."""
        student, teacher = model_config.hidden_size, self.teacher_config.hidden_size
        if not self.tinybert or student == teacher:
            return 0
        return 2 * (student + 1) * teacher

    def frozen_weights(self) -> tuple[tuple[str, int, int], ...]:
        """The teacher's weights, whole on every rank in ``teacher_dtype`` (counted from its config, on the meta
        device: the plan loads no weights)."""
        dtype = self.teacher_dtype()
        return ((f"teacher weights ({str(dtype).removeprefix('torch.')})", count_parameters(self.teacher_config),
                 dtype.itemsize),)

    def describe(self, model: nn.Module) -> str:
        teacher = sum(p.numel() for p in self.teacher().parameters())
        start = (f"from teacher layers {', '.join(map(str, self.layers))}" if self.from_teacher_layers() else
                 f"{model.config.hidden_size} wide, from scratch")
        fits = (", distilbert loss" if not self.tinybert else
                f", tinybert loss fitting teacher layers {', '.join(map(str, self.fitted))}")
        dtype = str(self.teacher_dtype()).removeprefix("torch.")
        return (f"{super().describe(model)} (a {len(self.layers)}-layer student {start}{fits}); teacher "
                f"{self.teacher_dir}, {teacher:,} parameters, frozen, {dtype}")

    def model_from_state(self, state: dict[str, torch.Tensor], config=None) -> BertForPreTraining:
        """The student alone: TinyBERT's projections (the loss module's ``projections.``) are training-only."""
        state = {k: v for k, v in state.items() if not k.startswith(tinybert_loss.PROJECTIONS)}
        return super().model_from_state(state, config)

    def _config_from_weights(self, state: dict[str, torch.Tensor]) -> BertConfig:
        """``pretrain.export`` of a checkpoint: the student's config, from the teacher's."""
        return self.student_config()

    def _check_vocabulary(self) -> None:
        """The teacher's logits index the dataset's vocabulary: the same vocab.txt (hash) or refused."""
        from common.manifest import Manifest
        from common.tokenizer import load_tokenizer

        if not self.data_path or not (Path(self.data_path) / "manifest.json").is_file():
            return  # e.g. the memory plan of a config without data: the run itself checks at set-up
        manifest = Manifest.read(self.data_path)
        for candidate in (self.teacher_dir / name for name in ("tokenizer", "vocab.txt", "tokenizer.json")):
            if candidate.exists():
                theirs = load_tokenizer(str(candidate), lowercase=manifest.tokenizer.lowercase).identity()
                if theirs["vocab_sha256"] == manifest.tokenizer.vocab_sha256:
                    return
                raise CheckpointError(f"{candidate} is not the vocabulary the dataset {self.data_path} was made "
                                      "with: the teacher's soft targets would name other tokens; preprocess with "
                                      "the teacher's vocab.txt (--tokenizer) to distil it")
        raise CheckpointError(f"{self.teacher_dir}: no vocab.txt, tokenizer.json or tokenizer/ to check against the "
                              "dataset's vocabulary; copy the teacher's vocab.txt into it")

    def _check_record(self) -> None:
        """Rank 0 records the teacher's weights hash in ``output_dir``; a run that already has checkpoints and a
        record of another teacher is refused (its checkpoints were distilled from that one)."""
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() != 0:
            return
        name, digest = weights_sha256(self.teacher_dir)
        now = {"teacher": str(self.teacher_dir), "weights": name, "sha256": digest,
               "config": json.loads((self.teacher_dir / "config.json").read_text())}
        record = self.output_dir / RECORD_NAME
        if record.is_file() and any((self.output_dir / "checkpoints").glob("step_*")):
            before = json.loads(record.read_text())
            if before.get("sha256") != digest:
                raise CheckpointError(
                    f"{record}: this run's checkpoints were distilled from {before.get('teacher')} (weights "
                    f"{str(before.get('sha256'))[:12]}…), but {self.teacher_dir} holds weights {digest[:12]}…; "
                    "point distillation.teacher at the run's teacher, or start a new output_dir")
        storage.write_json(str(record), now)  # whole or not at all: export reads the config from it


__all__ = ["DistillationFamily", "recorded_teacher_config", "student_layer_map", "student_seed", "student_state",
           "teacher_directory", "tinybert_summary", "weights_sha256"]
