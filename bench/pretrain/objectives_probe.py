"""The objectives benchmark's shared model and its held-out probe (``bench.pretrain.objectives``).

The probe is the same for every model: the held-out books as single-document rows with static 15% token masking
(80/10/10), read in order; a model's MLM head predicts the original token at every masked position. Reported: the
accuracy and the mean cross-entropy over those positions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.bert.hf import export, load_pretrained
from models.bert.model import BertConfig, BertForPreTraining
from pretrain.data import ShardedInstances, collate

# BERT's shape, small enough for CPU: 4 layers, 256 wide (as bench.pretrain.steps's model); the vocabulary is
# bert-base-uncased's 30,522 ids rounded up to a multiple of 8.
MODEL = dict(vocab_size=30528, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             max_position_embeddings=512)
INIT_SEED = 0
PROBE_ROWS, PROBE_BATCH = 4096, 64


def initial_model(directory: Path, dataset: Path) -> Path:
    """The one initialisation every recipe starts from, as a Hugging Face directory (made once)."""
    if not (directory / "config.json").is_file():
        torch.manual_seed(INIT_SEED)
        export(BertForPreTraining(BertConfig(**MODEL)), directory, tokenizer_dir=dataset / "tokenizer")
    return directory


@torch.no_grad()
def probe(model_dir: Path, dataset: Path, quick: bool = False) -> dict:
    """Masked-token accuracy and loss of ``model_dir``'s MLM head on the probe set's first rows."""
    model, _ = load_pretrained(model_dir)
    model.eval()
    data = ShardedInstances(dataset)
    rows = np.arange(min(len(data), 256 if quick else PROBE_ROWS))
    correct = total = 0
    loss_sum = 0.0
    for start in range(0, len(rows), PROBE_BATCH):
        batch = {k: torch.from_numpy(np.asarray(v)) for k, v in collate(data, rows[start:start + PROBE_BATCH]).items()}
        logits, _ = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                          batch["masked_positions"])
        labels = batch["masked_labels"]
        correct += int((logits.argmax(-1) == labels).sum())
        loss_sum += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
        total += int(labels.numel())
    return {"rows": int(len(rows)), "masked_tokens": total, "accuracy": round(correct / max(1, total), 4),
            "mlm_loss": round(loss_sum / max(1, total), 4)}


def table(results: dict) -> str:
    """The results as a Markdown table: pretraining spent, probe, and each GLUE task's primary score."""
    tasks = sorted({task for r in results.values() for task in r["glue"]})
    head = ["recipe", "steps", "CPU s", "probe acc", "probe loss", *[f"{t} (mean ± std)" for t in tasks]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        run = r["pretraining"] or {}
        cells = [name, str(run.get("last_logged_step", "–")), str(run.get("cpu_s", "–")),
                 f"{r['probe']['accuracy']:.3f}", f"{r['probe']['mlm_loss']:.2f}"]
        for task in tasks:
            metric = "f1" if task == "mrpc" else "accuracy"
            score = r["glue"].get(task, {}).get(metric)
            cells.append(f"{100 * score['mean']:.1f} ± {100 * score['std']:.1f}" if score else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
