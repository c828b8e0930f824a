"""What a user sees: rank 0's progress bar, log lines, a JSONL metrics file and DeepSpeed's monitor.

Only rank 0 creates a ``Monitor`` that writes; the other ranks get a silent one, so the training loop
calls the same methods everywhere.
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

# Dense bf16/fp16 tensor-core peaks (TFLOP/s) for MFU; set logging.peak_tflops for anything else.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
               "A10G": 125.0, "V100": 125.0, "B200": 2250.0, "GH200": 989.0}

log = logging.getLogger("pretrain")


def peak_tflops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name.upper():
            return PEAK_TFLOPS[key]
    return None


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, force=True,
                        format=f"%(asctime)s [rank {rank}] %(message)s", datefmt="%H:%M:%S")


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records of ``path`` past ``step`` (an interrupted attempt's, which a resumed run redoes),
    and a last line cut short by a kill, so the file holds each step once."""
    if not path.is_file():
        return
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(record, dict) and record.get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(line + "\n" for line in kept))
        partial.replace(path)
        log.info(f"{path}: dropped {dropped} records past the resumed step {step}")


class Monitor:
    def __init__(self, output_dir: Path | None, *, total_steps: int, start_step: int, progress: bool,
                 ds_monitor=None):
        self.enabled = output_dir is not None
        if self.enabled:
            keep_records_up_to(output_dir / "metrics.jsonl", start_step)
        self.metrics_file = (output_dir / "metrics.jsonl").open("a") if self.enabled else None
        self.ds_monitor = ds_monitor if self.enabled else None
        self.bar = None
        if self.enabled and progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        self.started = time.time()

    def step(self, loss: float | None = None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if loss is not None and math.isfinite(loss):
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def record(self, metrics: dict, *, line: bool) -> None:
        """Append one JSONL record (and TensorBoard/CSV events); a log line when ``line``."""
        if not self.enabled:
            return
        self.metrics_file.write(json.dumps(metrics) + "\n")
        self.metrics_file.flush()
        if self.ds_monitor is not None and getattr(self.ds_monitor, "enabled", False):
            step = metrics["step"]
            self.ds_monitor.write_events([(f"Train/{k}", v, step) for k, v in metrics.items()
                                          if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)])
        if line:
            self.info(format_line(metrics))

    def record_evaluation(self, record: dict) -> None:
        """Append an evaluation's JSONL record (its figures named ``eval/...``), and the same TensorBoard/CSV names."""
        if not self.enabled:
            return
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        if self.ds_monitor is not None and getattr(self.ds_monitor, "enabled", False):
            self.ds_monitor.write_events([(k, v, record["step"]) for k, v in record.items() if k.startswith("eval/")
                                          and isinstance(v, (int, float)) and math.isfinite(v)])

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            log.info(message)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.metrics_file is not None:
            self.metrics_file.close()


def format_line(m: dict) -> str:
    parts = [f"step {m['step']}", f"loss {m['loss']:.4f}", f"mlm {m['mlm_loss']:.4f} (acc {m['mlm_accuracy']:.3f})"]
    parts += [f"{head} {m[f'{head}_loss']:.4f} (acc {m[f'{head}_accuracy']:.3f})" for head in ("nsp", "sop", "disc")
              if f"{head}_loss" in m]  # disc: ELECTRA's discriminator (mlm is then its generator)
    parts += [f"lr {m['lr']:.3g}", f"grad-norm {m['grad_norm']:.3g}", f"{m['tokens_per_second']:,.0f} tok/s"]
    if m.get("loss_scale") not in (None, 1.0):
        parts.append(f"scale {m['loss_scale']:g}")
    if m.get("mfu") is not None:
        parts.append(f"MFU {100 * m['mfu']:.1f}%")
    if m.get("skipped_steps"):
        parts.append(f"skipped {m['skipped_steps']}")
    return " | ".join(parts)
