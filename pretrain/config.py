"""The pretraining stage's typed configuration (one YAML per run under configs/pretrain/).

Sizes come from a model preset plus overrides; batch sizes are given as the global batch and the
micro-batch per GPU, and gradient accumulation follows from the world size at launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common import configlib
from common.objectives import MASK_UNITS, MASKING_TIMES, SENTENCE_OBJECTIVES, check_replacement_split
from models import registry
from pretrain.schedule import ScheduleConfig

PRECISIONS = ("auto", "bf16", "fp16", "fp32")  # auto: chosen from the hardware (pretrain.precision)
FAMILIES = registry.MODEL_TYPES  # each with its training glue in pretrain.families
OPTIMIZERS = ("adamw", "lamb")
ATTENTIONS = ("full", "document")


@dataclass(frozen=True)
class ModelConfig:
    family: str = "bert"                 # bert | albert | electra (pretrain.families)
    preset: str = "base"                 # one of the family's presets: tiny | base | large for BERT, albert_base ...
    init_from: str | None = None         # a Hugging Face directory of the family, or one of our run directories
    vocab_size: int | None = None        # default: the dataset's vocabulary, rounded up to a multiple of 8
    hidden_dropout_prob: float | None = None
    attention_probs_dropout_prob: float | None = None
    max_position_embeddings: int = 512
    activation_checkpointing: bool = False
    padding_free: bool = False           # dense layers on real tokens only (pretrain.families.bert_loss); equal to rounding
    compile: bool = False                # run the model through torch.compile (lengths bucketed: few recompiles)
    # CUDA graphs for the compiled regions (torch.compile's "reduce-overhead"): fewer kernel launches; GPU only.
    compile_cuda_graphs: bool = False
    # TorchInductor's kernel cache (default: the user's temp dir). On a shared file system every node and every
    # resumed job start warm. It holds code that runs: a directory only you can write (pretrain.compiling).
    compile_cache: str | None = None

    def dropout_overrides(self) -> dict[str, float]:
        """The dropout rates this config sets over the preset's (those left unset keep the preset's)."""
        return {k: getattr(self, k) for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")
                if getattr(self, k) is not None}

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"model.family is {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if (self.compile_cuda_graphs or self.compile_cache) and not self.compile:
            raise ValueError("model.compile_cuda_graphs and model.compile_cache apply to compiled models: set "
                             "model.compile: true, or leave them unset")


@dataclass(frozen=True)
class ElectraTrainingConfig:
    """ELECTRA's two settings beyond the model preset (``model.family: electra``)."""

    generator_fraction: float | None = None  # generator width / discriminator width; None: the preset's (1/4, 1/3)
    discriminator_weight: float = 50.0       # lambda in loss = generator MLM + lambda x discriminator (the paper's)

    def __post_init__(self):
        if self.generator_fraction is not None and not 0.0 < self.generator_fraction <= 1.0:
            raise ValueError(f"electra.generator_fraction must be in (0, 1], got {self.generator_fraction}")
        if self.discriminator_weight < 0:
            raise ValueError(f"electra.discriminator_weight must be >= 0, got {self.discriminator_weight}")


@dataclass(frozen=True)
class DistillationConfig:
    """Knowledge distillation: set ``teacher`` to distil it into the run's model, with ``loss``:

    ``distilbert`` (Sanh et al. 2019): kl_weight x KL(teacher || student) of the masked-token distributions at
    ``temperature`` (times T^2) + mlm_weight x the student's masked-LM loss + cosine_weight x (1 - cos) of the last
    hidden states.
    ``tinybert`` (Jiao et al. 2020, general distillation): embedding_weight x MSE(embeddings W_e, teacher's)
    + hidden_weight x sum over student layers m of MSE(hidden_m W_h, teacher hidden_g(m)) + attention_weight x the
    same of the unnormalised attention scores + prediction_weight x soft cross-entropy of the masked tokens at
    ``temperature`` (0 in general distillation); g(m) = m x N / M, or ``layer_map``.
    The student is the teacher's architecture with ``student_layers`` layers (default: half) and, if set, another
    width, FFN or head count; of the teacher's shape it starts from every other teacher layer, else from scratch.
    ``model.preset`` and ``model.init_from`` are then not used.
    """

    teacher: str | None = None           # a Hugging Face BERT directory or one of our run directories
    loss: str = "distilbert"             # distilbert | tinybert
    temperature: float = 2.0
    kl_weight: float = 5.0               # DistilBERT's alpha_ce
    mlm_weight: float = 2.0              # alpha_mlm
    cosine_weight: float = 1.0           # alpha_cos
    embedding_weight: float = 1.0        # TinyBERT's embedding-layer MSE
    hidden_weight: float = 1.0           # TinyBERT's hidden-state MSE, summed over the student's layers
    attention_weight: float = 1.0        # TinyBERT's attention-score MSE, summed over the student's layers
    prediction_weight: float = 0.0       # TinyBERT's prediction-layer soft cross-entropy (task distillation's)
    layer_map: list[int] | None = None   # tinybert: the teacher layer (1..N) of each student layer; default m x N / M
    student_layers: int | None = None    # default: half the teacher's layers
    student_hidden_size: int | None = None        # default: the teacher's (tinybert only may differ)
    student_intermediate_size: int | None = None  # default: the teacher's
    student_attention_heads: int | None = None    # default: the teacher's
    teacher_precision: str = "auto"      # auto | bf16 | fp16 | fp32: the dtype of the teacher's no-grad forward

    def __post_init__(self):
        if self.loss not in DISTILLATION_LOSSES:
            raise ValueError(f"distillation.loss is {self.loss!r}; choose one of {', '.join(DISTILLATION_LOSSES)}")
        if self.temperature <= 0:
            raise ValueError(f"distillation.temperature must be > 0, got {self.temperature}")
        weights = ("kl_weight", "mlm_weight", "cosine_weight", "embedding_weight", "hidden_weight",
                   "attention_weight", "prediction_weight")
        if min(getattr(self, name) for name in weights) < 0:
            raise ValueError(f"distillation weights ({', '.join(weights)}) must be >= 0")
        other = _LOSS_KEYS["tinybert" if self.loss == "distilbert" else "distilbert"]
        changed = [name for name in other if getattr(self, name) != getattr(DistillationConfig, name)]
        if changed:
            raise ValueError(f"distillation.{changed[0]} applies to distillation.loss "
                             f"{'tinybert' if self.loss == 'distilbert' else 'distilbert'}, not {self.loss}; "
                             "leave it unset or change the loss")
        for name in ("student_layers", "student_hidden_size", "student_intermediate_size", "student_attention_heads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"distillation.{name} must be >= 1, got {getattr(self, name)}")
        if self.layer_map is not None and (not self.layer_map or min(self.layer_map) < 1):
            raise ValueError(f"distillation.layer_map {self.layer_map}: one teacher layer (1..N) per student layer")
        if self.teacher_precision not in PRECISIONS:
            raise ValueError(f"distillation.teacher_precision must be one of {PRECISIONS}, "
                             f"got {self.teacher_precision!r}")


DISTILLATION_LOSSES = ("distilbert", "tinybert")
# The keys only one loss reads: set for the other, they are refused rather than silently unused.
_LOSS_KEYS = {"distilbert": ("kl_weight", "mlm_weight", "cosine_weight"),
              "tinybert": ("embedding_weight", "hidden_weight", "attention_weight", "prediction_weight",
                           "layer_map")}


@dataclass(frozen=True)
class DataConfig:
    path: str = ""                       # a dataset directory written by `python -m preprocess run`
    window_batches: int = 64             # length grouping window, in global batches
    verify: bool = False                 # hash every shard against the manifest at start-up (slow on big data)
    # Each micro-batch is padded to the next multiple of this, never past the dataset's sequence length: 8 aligns
    # for tensor cores; 32 at seq 128 or 64 at seq 512 gives a few static widths (compiled graphs, kernel plans and
    # CUDA graphs made once per width); the sequence length itself gives one width. Only the padding changes.
    pad_multiple: int = 8

    def __post_init__(self):
        if self.window_batches < 1:
            raise ValueError("window_batches must be >= 1")
        if self.pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {self.pad_multiple}")


@dataclass(frozen=True)
class ObjectiveConfig:
    """What the run trains on its dataset (the menu: ``common.objectives``), checked against the dataset's
    manifest at start-up (``pretrain.recipe.resolve``).

    ``masking`` and ``sentence_objective`` must equal the manifest's: they say what the rows are. The masking
    recipe (``mask_unit``, ``masked_lm_prob``, ``max_predictions``) is the loader's on a dynamic dataset, where an
    unset one takes the value the manifest records (what preprocessing was asked for) and an unset cap is no cap
    beyond the rate; on a static dataset the masks are in the shards, so each is left unset or states the
    manifest's value (any other is refused rather than silently not applied).
    """

    masking: str = "static"              # static | dynamic: as the dataset's manifest says
    sentence_objective: str = "nsp"      # nsp | sop | none: as the dataset's manifest says
    attention: str = "full"              # full | document: packed rows attend within their document only
    mask_unit: str | None = None         # token | whole_word | span | ngram
    masked_lm_prob: float | None = None  # share of a row's tokens to predict (0.15 BERT, 0.3-0.4 later recipes)
    max_predictions: int | None = None   # per row
    mask_token_fraction: float | None = None    # chosen positions shown as [MASK] (0.8 BERT), a random token
    random_token_fraction: float | None = None  # (0.1), else themselves
    # SpanBERT's span-boundary objective beside MLM: each masked span's tokens also predicted from the two tokens
    # just outside it (pretrain.families.spanbert); span masking, BERT family only
    span_boundary: bool = False

    def __post_init__(self):
        for name, allowed in (("masking", MASKING_TIMES), ("sentence_objective", SENTENCE_OBJECTIVES),
                              ("attention", ATTENTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"objective.{name} is {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        if self.mask_unit is not None and self.mask_unit not in MASK_UNITS:
            raise ValueError(f"objective.mask_unit is {self.mask_unit!r}; choose one of {', '.join(MASK_UNITS)}")
        if self.masked_lm_prob is not None and not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"objective.masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.mask_token_fraction is not None or self.random_token_fraction is not None:
            check_replacement_split(0.8 if self.mask_token_fraction is None else self.mask_token_fraction,
                                    0.1 if self.random_token_fraction is None else self.random_token_fraction)
        if self.max_predictions is not None and self.max_predictions < 1:
            raise ValueError(f"objective.max_predictions must be >= 1, got {self.max_predictions}")
        if self.span_boundary and self.mask_unit not in (None, "span"):
            raise ValueError(f"objective.span_boundary predicts masked spans from their boundaries, but "
                             f"objective.mask_unit is {self.mask_unit!r}: set objective.mask_unit: span")


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 1000                # optimizer steps
    global_batch_size: int = 256         # sequences per optimizer step, over all ranks
    micro_batch_size: int = 32           # sequences per forward pass on one rank
    precision: str = "auto"              # auto (pretrain.precision) | bf16 | fp16 (dynamic loss scaling) | fp32
    gradient_clipping: float = 1.0       # 0 disables
    initial_scale_power: int = 16        # fp16: the loss scale starts at 2**this
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if min(self.max_steps, self.global_batch_size, self.micro_batch_size) < 1:
            raise ValueError("max_steps, global_batch_size and micro_batch_size must be >= 1")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(f"global_batch_size {self.global_batch_size} is not a multiple of "
                             f"micro_batch_size {self.micro_batch_size}")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"                  # adamw | lamb
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    torch_adam: bool = False             # plain torch AdamW instead of DeepSpeed's fused kernel (CPU)

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")


@dataclass(frozen=True)
class ZeroConfig:
    stage: int = 1
    offload_optimizer: str = "none"      # none | cpu | nvme
    offload_param: str = "none"          # none | cpu | nvme (stage 3 only)
    nvme_path: str | None = None

    def __post_init__(self):
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"zero stage must be 0, 1, 2 or 3, got {self.stage}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in ("none", "cpu", "nvme"):
                raise ValueError(f"{name} must be none, cpu or nvme")
        if self.offload_param != "none" and self.stage != 3:
            raise ValueError("offload_param needs zero stage 3")
        if self.offload_optimizer != "none" and self.stage == 0:
            raise ValueError("offload_optimizer needs zero stage 1, 2 or 3")
        if "nvme" in (self.offload_optimizer, self.offload_param) and not self.nvme_path:
            raise ValueError("nvme offload needs zero.nvme_path")


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 1000              # 0: only at the end and on preemption
    keep_last: int = 3
    export_hf: bool = True               # write a Hugging Face directory at the end of the run
    on_corrupt: str = "fallback"         # resume past a checkpoint whose files fail their checksums: fallback | fail
    # An evaluation metric (e.g. mlm_accuracy): also keep the checkpoint of the best evaluation by it, beside the
    # newest keep_last (pretrain.evaluation); python -m pretrain.export RUN OUT --best exports it.
    keep_best: str | None = None

    def __post_init__(self):
        if self.every_steps < 0 or self.keep_last < 1:
            raise ValueError("every_steps must be >= 0 and keep_last >= 1")
        if self.on_corrupt not in ("fallback", "fail"):
            raise ValueError(f"checkpoint.on_corrupt must be fallback or fail, got {self.on_corrupt!r}")


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation on the dataset's held-out split (``pretrain.evaluation``): on whenever the split exists."""

    every_steps: int = 0                 # steps between evaluations; 0: only at the end of the run
    max_rows: int | None = None          # the split's first rows scored; None: the whole split
    batch_size: int = 32                 # rows per evaluation forward (train.micro_batch_size does not apply)
    target: dict[str, float] | None = None  # e.g. {mlm_accuracy: 0.72}: the run ends the first time all are met
    data: str | None = None              # the dataset whose split is scored; None: data.path's

    def __post_init__(self):
        if self.every_steps < 0:
            raise ValueError(f"eval.every_steps is {self.every_steps}; set it >= 0 (0: evaluate at the end only)")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"eval.max_rows is {self.max_rows}; set it >= 1, or leave it unset for the whole split")
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size is {self.batch_size}; set it >= 1")
        if self.target is not None and not self.target:
            raise ValueError("eval.target is empty; name at least one metric (e.g. {mlm_accuracy: 0.72}) or remove it")


@dataclass(frozen=True)
class FaultConfig:
    max_consecutive_skips: int = 25      # non-finite steps in a row before the run stops
    timeout_minutes: float = 30.0        # a collective that waits longer fails the job instead of hanging
    # Seconds the launcher leaves between SIGTERM and SIGKILL (torchrun, deepspeed: 30; Slurm: KillWait, 30;
    # Kubernetes: terminationGracePeriodSeconds), counted from the first SIGTERM. A step that cannot end and save
    # within it is cut short at a micro-batch boundary (pretrain.preemption); 0: no grace known, a SIGTERM waits for
    # the step boundary.
    grace_seconds: float = 30.0
    # Seconds between Slurm's warning SIGUSR1 (--signal=USR1@N: N) and the SIGTERM of the time limit; used as
    # grace_seconds is, for SIGUSR1. 0: unknown, a SIGUSR1 waits for the step boundary. python -m cluster sets both.
    warning_seconds: float = 0.0

    def __post_init__(self):
        for key in ("grace_seconds", "warning_seconds"):
            if getattr(self, key) < 0:
                raise ValueError(f"faults.{key} must be >= 0 (0: not known), got {getattr(self, key)}")


@dataclass(frozen=True)
class LoggingConfig:
    log_every: int = 10                  # steps between a metrics record and a log line
    tensorboard: bool = True
    csv: bool = False
    progress: bool = True                # rank 0's progress bar, when stderr is a terminal
    peak_tflops: float | None = None     # per-GPU peak for MFU; default: looked up from the GPU's name


@dataclass(frozen=True)
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    seed: int = 1234
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    electra: ElectraTrainingConfig = field(default_factory=ElectraTrainingConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(total_steps=1000, warmup_steps=0))
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self):
        if "://" in self.output_dir:  # Path("s3://b/run") is the local directory "s3:/b/run": refuse, not misplace
            raise ValueError(f"output_dir {self.output_dir!r} is an object-store URI; checkpoints are written as files "
                             "by every rank: give a local or shared file-system path and copy the run (or its hf/ "
                             "export) to the store afterwards")
        if self.schedule.total_steps != self.train.max_steps:
            raise ValueError(f"schedule.total_steps ({self.schedule.total_steps}) differs from train.max_steps "
                             f"({self.train.max_steps}); set both (the schedule decays to the end of the run)")
        if self.model.family == "electra" and self.objective.sentence_objective != "none":
            raise ValueError(f"model.family electra trains no sentence-pair head, but objective.sentence_objective is "
                             f"{self.objective.sentence_objective!r}: pretrain ELECTRA on a dataset made with "
                             "sentence_objective none (e.g. configs/preprocess/electra_seq128.yaml)")
        if self.objective.span_boundary and (self.model.family != "bert" or self.distillation.teacher):
            what = "distillation" if self.distillation.teacher else f"model.family {self.model.family}"
            raise ValueError(f"objective.span_boundary (SpanBERT) trains a BERT; {what} has no span-boundary "
                             "objective: set objective.span_boundary: false, or model.family: bert without a teacher")
        if self.distillation.teacher and self.model.family != "bert":
            raise ValueError(f"distillation distils into a BERT student; model.family is {self.model.family!r}")
        if self.distillation.loss != "distilbert" and not self.distillation.teacher:
            raise ValueError(f"distillation.loss {self.distillation.loss} distils a teacher: set distillation.teacher "
                             "(a Hugging Face BERT directory or one of our run directories)")
        if self.distillation.teacher and self.model.init_from:
            raise ValueError("distillation initialises the student from its teacher's layers; leave model.init_from "
                             "unset")
        if self.optimizer.name == "lamb" and self.zero.stage > 0:
            raise ValueError("LAMB computes a trust ratio per parameter tensor, which ZeRO's flat partitions "
                             "break: use zero.stage 0 with lamb (fp16 or fp32), or adamw with ZeRO")
        if self.train.precision == "bf16" and self.zero.stage == 0:
            raise ValueError("bf16 without ZeRO would keep no fp32 master weights in DeepSpeed: use zero.stage 1 "
                             "or more with bf16, or fp16 (dynamic loss scaling) with zero.stage 0")


def load(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> PretrainConfig:
    return configlib.load(PretrainConfig, path, overrides)


@dataclass(frozen=True)
class BatchPlan:
    """How the global batch is split at a given world size."""

    global_batch: int
    micro_batch: int
    world_size: int
    accumulation: int

    def describe(self) -> str:
        return (f"global batch {self.global_batch} = micro-batch {self.micro_batch} x {self.world_size} ranks "
                f"x {self.accumulation} accumulation steps")


def batch_plan(train: TrainConfig, world_size: int) -> BatchPlan:
    per_step = train.micro_batch_size * world_size
    if train.global_batch_size % per_step:
        raise configlib.ConfigError(
            f"train.global_batch_size {train.global_batch_size} is not a multiple of micro_batch_size "
            f"{train.micro_batch_size} x {world_size} ranks; change one of them (or the number of GPUs)")
    return BatchPlan(train.global_batch_size, train.micro_batch_size, world_size, train.global_batch_size // per_step)
