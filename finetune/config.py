"""The finetuning stage's typed configuration: one YAML (configs/finetune/*.yaml) with a section per benchmark.

Defaults are the BERT paper's finetuning recipe: AdamW, linear warm-up over 10% of the steps then linear
decay, batch 32, 3 epochs for GLUE (lr chosen on dev among 5e-5, 4e-5, 3e-5, 2e-5; we fix one per task),
2 epochs at lr 3e-5 and batch 32 for SQuAD, and 3-4 epochs for CoNLL.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from common import configlib


@dataclass(frozen=True)
class TrainingConfig:
    lr: float = 2e-5
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 128
    max_seq_length: int = 128
    warmup_proportion: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    dropout: float = 0.1
    precision: str = "auto"          # auto | bf16 | fp16 (GPU) | fp32; auto: from the hardware (pretrain.precision)
    max_train_examples: int = 0      # 0: all; for quick runs and tests
    max_eval_examples: int = 0
    select_best_epoch: bool = True   # keep the epoch with the best dev score (the dev-set protocol)
    # DeepSpeed for models too large for plain AdamW on one device: -1 = plain PyTorch; 0, 1 or 2 = that ZeRO
    # stage in one process, with offload_optimizer putting the optimizer state in CPU memory (ZeRO-Offload).
    deepspeed_zero_stage: int = -1
    offload_optimizer: bool = False
    compile: bool = False            # torch.compile the task model (pretrain.compiling): the eager losses to rounding

    def __post_init__(self):
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"precision must be auto, bf16, fp16 or fp32, got {self.precision!r}")
        if self.lr <= 0 or self.epochs <= 0 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("lr and epochs must be > 0, batch sizes >= 1")
        if self.deepspeed_zero_stage not in (-1, 0, 1, 2):
            raise ValueError("deepspeed_zero_stage must be -1 (no DeepSpeed), 0, 1 or 2; ZeRO 3 would shard the "
                             "weights that finetuning keeps and evaluates in one process")
        if self.offload_optimizer and self.deepspeed_zero_stage < 1:
            raise ValueError("offload_optimizer needs deepspeed_zero_stage 1 or 2")
        if not 0 <= self.warmup_proportion < 1:
            raise ValueError("warmup_proportion must be in [0, 1)")


@dataclass(frozen=True)
class GlueConfig:
    training: TrainingConfig = field(default_factory=TrainingConfig)
    # Per-task changes to `training`, e.g. {"rte": {"lr": 3e-5, "epochs": 4}}.
    per_task: dict = field(default_factory=dict)

    def __post_init__(self):
        from finetune.glue import GLUE_TASKS

        for task in self.per_task:  # checked at load, not when the task's turn comes hours into a suite
            if task not in GLUE_TASKS:  # a misspelt name would otherwise leave its task on the shared settings
                close = difflib.get_close_matches(str(task), GLUE_TASKS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise configlib.ConfigError(f"glue.per_task: unknown GLUE task {str(task)[:40]!r}{hint}; known "
                                            f"tasks: {', '.join(GLUE_TASKS)}")
            task_training(self, task)


@dataclass(frozen=True)
class SquadConfig:
    training: TrainingConfig = field(default_factory=lambda: TrainingConfig(lr=3e-5, epochs=2.0, max_seq_length=384))
    train_file: str = "squad/train-v1.1.json"   # relative to --data
    dev_file: str = "squad/dev-v1.1.json"
    version_2: bool = False
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


@dataclass(frozen=True)
class ConllConfig:
    training: TrainingConfig = field(default_factory=lambda: TrainingConfig(lr=5e-5, epochs=3.0))
    train_file: str = "conll2003/iob2/train.txt"
    dev_file: str = "conll2003/iob2/valid.txt"
    test_file: str = "conll2003/iob2/test.txt"


@dataclass(frozen=True)
class FinetuneConfig:
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    glue: GlueConfig = field(default_factory=GlueConfig)
    squad: SquadConfig = field(default_factory=SquadConfig)
    conll: ConllConfig = field(default_factory=ConllConfig)
    # Write each task's selected model as a transformers task-model directory, <output>/models/<task>/
    # (finetune.task_models): the best epoch of save_seed, or of the median seed by the task's main metric.
    save_models: bool = False
    save_seed: int | None = None

    def __post_init__(self):
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.save_seed is not None and self.save_seed not in self.seeds:
            raise ValueError(f"save_seed {self.save_seed} is not one of seeds {self.seeds}")


def load(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> FinetuneConfig:
    return configlib.load(FinetuneConfig, path, overrides)


def task_training(cfg: GlueConfig, task: str) -> TrainingConfig:
    """The GLUE training settings of one task: the shared ones with that task's changes applied."""
    changes = cfg.per_task.get(task) or {}
    if not isinstance(changes, dict):
        raise configlib.ConfigError(f"glue.per_task.{task}: expected a mapping of training settings (e.g. lr: 3e-5), "
                                    f"got a {type(changes).__name__}")
    return configlib.from_dict(TrainingConfig, {**configlib.to_dict(cfg.training), **changes}, f"glue.per_task.{task}")
