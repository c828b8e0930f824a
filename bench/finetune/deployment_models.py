"""The encoders the deployment benchmark measures: built with random weights, written by our own export code as
Hugging Face directories, and exported from there to ONNX with ``torch.onnx`` (checked against ``transformers``).

Random weights are enough here: latency, throughput, size and memory do not depend on the values of the weights.
Shapes come from the shipped presets: the distillation teacher (BERT ``base``) and its student with the depth
``configs/pretrain/distilbert_base.yaml`` gives it (``distillation.student_layers`` of BERT-base's 12), initialised
from the teacher's layers as a distillation run does; ``albert_base`` and ``electra_base`` (the discriminator, what
finetuning and deployment use) beside BERT-base. ``tiny`` is the same set at the tiny presets, for tests.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from bench import record

DISTILLATION_PRESET = record.REPO / "configs" / "pretrain" / "distilbert_base.yaml"
DISTILLATION_TEACHER_LAYERS = 12      # the preset's teacher is BERT-base (its header comment)
VOCAB_SIZE = 30522                    # one vocabulary for every family: bert-base-uncased's size
MODELS = ("bert", "distilled", "albert", "electra")  # "bert" is both the teacher and the family comparison's BERT
PRESETS = {  # the family presets of each size
    "base": {"bert": "base", "albert": "albert_base", "electra": "electra_base"},
    "tiny": {"bert": "tiny", "albert": "albert_tiny", "electra": "electra_tiny"},
}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOLERANCE = 1e-4                      # max |ONNX Runtime - transformers| over every output element, fp32


def student_layers(teacher_layers: int) -> int:
    """The student's depth: the distillation preset's fraction of its 12-layer teacher (6 of 12), at least 1."""
    settings = yaml.safe_load(DISTILLATION_PRESET.read_text())["distillation"]
    return max(1, teacher_layers * settings["student_layers"] // DISTILLATION_TEACHER_LAYERS)


def build_exports(size: str, work: Path, names: tuple[str, ...] = MODELS, seed: int = 0,
                  reuse: bool = False) -> dict[str, dict]:
    """Write the Hugging Face directories of ``names`` (of ``MODELS``) under ``work`` (``work/<model>/``); returns,
    per model, its directory, preset and role. ``reuse``: a complete directory already there is kept (the same
    seed wrote it)."""
    import torch

    from models.albert.hf import export_albert
    from models.albert.model import AlbertForPreTraining
    from models.albert.model import preset as albert_preset
    from models.bert.hf import export
    from models.bert.model import BertForPreTraining
    from models.bert.model import preset as bert_preset
    from models.electra.hf import export_discriminator
    from models.electra.model import ElectraDiscriminator
    from models.electra.model import preset as electra_preset
    from models.hf_io import is_complete
    from pretrain.families.distillation import student_layer_map, student_state

    presets, out = PRESETS[size], {}

    def wanted(name: str) -> bool:
        return name in names and not (reuse and is_complete(work / name))

    torch.manual_seed(seed)
    teacher = BertForPreTraining(bert_preset(presets["bert"], vocab_size=VOCAB_SIZE))
    if wanted("bert"):
        export(teacher, work / "bert")
    if "bert" in names:
        out["bert"] = {"preset": presets["bert"], "role": "distillation teacher; BERT in the family comparison"}
    depth = student_layers(teacher.config.num_hidden_layers)
    layers = student_layer_map(teacher.config.num_hidden_layers, depth)
    if wanted("distilled"):
        student = BertForPreTraining(replace(teacher.config, num_hidden_layers=depth))
        missing = student.load_state_dict(student_state(teacher.state_dict(), layers), strict=False).missing_keys
        if [k for k in missing if k != "cls.predictions.decoder.weight"]:
            raise RuntimeError(f"the student could not take {missing[:3]} from the teacher")
        export(student, work / "distilled")
    if "distilled" in names:
        out["distilled"] = {"preset": f"{DISTILLATION_PRESET.stem} student of BERT {presets['bert']}",
                            "role": f"distilled student: teacher layers {layers}"}
    del teacher
    if wanted("albert"):
        export_albert(AlbertForPreTraining(albert_preset(presets["albert"], vocab_size=VOCAB_SIZE)), work / "albert")
    if "albert" in names:
        out["albert"] = {"preset": presets["albert"], "role": "family comparison"}
    if wanted("electra"):
        discriminator = electra_preset(presets["electra"], vocab_size=VOCAB_SIZE).discriminator
        export_discriminator(ElectraDiscriminator(discriminator), work / "electra")
    if "electra" in names:
        out["electra"] = {"preset": f"{presets['electra']} (discriminator)", "role": "family comparison"}
    for name, entry in out.items():
        entry["hf_dir"] = str(work / name)
    return out


def example_inputs(batch: int, seq: int, seed: int = 0, padded_rows: int = 0) -> dict[str, np.ndarray]:
    """Random token ids (int64) as a tokenizer would give them; the last ``padded_rows`` rows are half padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB_SIZE, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for row in range(batch - padded_rows, batch):
        mask[row, seq // 2:] = 0
        ids[row, seq // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), dtype=np.int64)}


def load_transformers(hf_dir: str | Path):
    """``transformers.AutoModel`` of an export, in eval mode, fp32: the encoder a deployment runs."""
    import torch
    import transformers

    return transformers.AutoModel.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


def transformers_outputs(model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with torch.inference_mode():
        out = model(**{name: torch.from_numpy(value) for name, value in inputs.items()})
    return {name: value.numpy() for name, value in out.items() if torch.is_tensor(value)}


def export_onnx(hf_dir: str | Path, onnx_path: Path, seq: int) -> dict:
    """``torch.onnx.export`` (the dynamo exporter) of the export's ``AutoModel``, batch and sequence dynamic;
    returns the output names, the exporter and the seconds it took."""
    import torch

    class Tensors(torch.nn.Module):
        """The encoder as a function of the three inputs to its output tensors (what ONNX exports)."""

        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return tuple(value for value in out.values() if torch.is_tensor(value))

    model = load_transformers(hf_dir)
    sample = example_inputs(2, min(seq, 16))
    names = list(transformers_outputs(model, sample))
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    dims = {0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("sequence", min=2, max=seq * 4)}
    with torch.inference_mode(False), torch.no_grad():
        program = torch.onnx.export(Tensors(model), tuple(torch.from_numpy(sample[n]) for n in INPUTS),
                                    input_names=list(INPUTS), output_names=names, dynamo=True,
                                    dynamic_shapes=(dims, dims, dims), optimize=True, verbose=False)
    program.save(str(onnx_path))
    return {"outputs": names, "exporter": "torch.onnx.export(dynamo=True, optimize=True)",
            "opset": onnx_opset(onnx_path), "export_s": round(time.perf_counter() - started, 1)}


def onnx_opset(onnx_path: Path) -> int | None:
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def ort_session(onnx_path: str | Path, threads: int):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads, one inter-op thread, sequential execution
    and every graph optimisation (ONNX Runtime's default level)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def verify_onnx(hf_dir: str | Path, onnx_path: Path, seq: int, threads: int) -> dict:
    """Run ``transformers`` and ONNX Runtime on two batches (one row of 1; three rows, one half padding): the
    largest absolute difference of any output element, and whether it is within ``TOLERANCE``."""
    model, session = load_transformers(hf_dir), ort_session(onnx_path, threads)
    worst, checked = 0.0, []
    for batch, padded in ((1, 0), (3, 1)):
        inputs = example_inputs(batch, seq, seed=batch, padded_rows=padded)
        theirs = transformers_outputs(model, inputs)
        ours = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
        if set(ours) != set(theirs):
            raise RuntimeError(f"{onnx_path}: outputs {sorted(ours)}, transformers gives {sorted(theirs)}")
        for name, value in theirs.items():
            worst = max(worst, float(np.max(np.abs(ours[name] - value))))
        checked.append([batch, seq])
    return {"max_abs_diff": worst, "tolerance": TOLERANCE, "within_tolerance": worst <= TOLERANCE,
            "shapes_checked": checked}


def bytes_on_disk(*paths: Path) -> int:
    """The bytes of the files (a directory: every file under it)."""
    total = 0
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return total


__all__ = ["INPUTS", "MODELS", "PRESETS", "TOLERANCE", "build_exports", "bytes_on_disk", "example_inputs",
           "export_onnx", "load_transformers", "onnx_opset", "ort_session", "student_layers", "transformers_outputs",
           "verify_onnx"]
