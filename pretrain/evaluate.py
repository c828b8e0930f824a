"""Score a model on a dataset's held-out split, with the figures a run's evaluation reports (``pretrain.evaluation``).

    python -m pretrain.evaluate --model runs/bert-base --data data/wiki_books           # the run's newest checkpoint
    python -m pretrain.evaluate --model runs/bert-base --checkpoint best --data ...      # its checkpoint.keep_best one
    python -m pretrain.evaluate --model bert-base-uncased/ --data ... --output scores.json   # a Hugging Face directory

``--model`` is one of our run directories (a checkpoint of it, or its hf/ export when it has no checkpoint) or a
Hugging Face directory of a family we load (its config.json's model_type). One process, CPU unless ``--device``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.errors import CheckpointError, ConfigError, DatasetFormatError, report
from common.manifest import ModelRequirements


def load_scored(model_dir: Path, checkpoint: str, sentence_objective: str):
    """(family, model, layout, what was loaded) for ``--model``; a run's own settings where it is one of ours."""
    from pretrain import checkpoints, export
    from pretrain.evaluation import Layout

    if (model_dir / "config.yaml").is_file() and checkpoints.complete(model_dir / "checkpoints"):
        found = export.best_checkpoint(model_dir) if checkpoint == "best" else export.find_checkpoint(model_dir)
        cfg, family, model = export.checkpoint_model(found)
        layout = Layout(cfg.data.pad_multiple, cfg.objective.attention == "document", cfg.model.padding_free)
        return family, model, layout, str(found.path)
    return (*_hugging_face(checkpoints.finished_export(model_dir) or model_dir, sentence_objective), str(model_dir))


# A preset each family's glue accepts; the weights and sizes come from the directory (model.init_from).
_PRESETS = {"electra": "electra_small", "deberta-v2": "deberta_v3_small", "albert": "albert_base"}


def _hugging_face(directory: Path, sentence_objective: str):
    from models.hf_io import read_json_object
    from pretrain import families
    from pretrain.config import ModelConfig, ObjectiveConfig, PretrainConfig
    from pretrain.evaluation import Layout

    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: neither one of our run directories (config.yaml and a complete "
                              "checkpoint) nor a Hugging Face directory (config.json); give one of them")
    model_type = read_json_object(directory / "config.json").get("model_type", "bert")
    pair = "none" if model_type in ("electra", "deberta-v2") else sentence_objective
    cfg = PretrainConfig(model=ModelConfig(family=model_type, preset=_PRESETS.get(model_type, "base"),
                                           init_from=str(directory)),
                         objective=ObjectiveConfig(sentence_objective=pair))
    family = families.for_config(cfg)
    model, fresh = family.load_model(directory)
    if fresh:
        print(f"note: {directory} lacks {', '.join(fresh[:3])}{'...' if len(fresh) > 3 else ''}: scored "
              "freshly initialised", file=sys.stderr)
    return family, model, Layout()


def score(model_dir: Path, data: Path, *, checkpoint: str = "last", max_rows: int | None = None,
          batch_size: int = 32, device: str = "cpu") -> dict:
    """The figures of ``--model`` on ``--data``'s split, as a JSON-ready report."""
    import torch

    from common.manifest import Manifest
    from pretrain.data import open_evaluation
    from pretrain.evaluation import LocalEngine, evaluate

    manifest = Manifest.read(data).evaluation_split()
    if manifest is None:
        raise DatasetFormatError(f"{data}: no evaluation split; preprocess with a heldout section "
                                 "(docs/preprocessing.md)")
    torch.manual_seed(0)  # a fresh head a directory lacks (noted) is drawn alike every time
    family, model, layout, loaded = load_scored(model_dir, checkpoint, manifest.objective.sentence_objective)
    split = open_evaluation(data, ModelRequirements(family.vocab_size(model), family.positions(model),
                                                    special_ids=manifest.tokenizer.special_ids))
    _check_vocabulary(model_dir, manifest)
    if max_rows is not None and max_rows > len(split):
        raise ConfigError(f"--max-rows is {max_rows} but the evaluation split of {data} has {len(split)} rows; "
                          f"give at most {len(split)}")
    engine = LocalEngine(family.loss_module(model.float()), device)
    figures = evaluate(engine, family, split, max_rows=max_rows, batch_size=batch_size, layout=layout)
    return {"model": str(model_dir), "loaded": loaded, "data": str(data), "figures": figures}


def _check_vocabulary(model_dir: Path, manifest) -> None:
    from pretrain.recipe import other_vocabulary

    candidate = other_vocabulary(model_dir, manifest)
    if candidate is not None:
        raise ConfigError(f"{candidate} is not the vocabulary the evaluation split was made with; score it "
                          "on a dataset preprocessed with the model's tokenizer")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a run directory or a Hugging Face directory")
    parser.add_argument("--data", type=Path, required=True, help="a dataset with a held-out split")
    parser.add_argument("--checkpoint", choices=("last", "best"), default="last",
                        help="of a run: its newest checkpoint, or its best by checkpoint.keep_best")
    parser.add_argument("--max-rows", type=int, default=None, help="the split's first rows (default: all)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per forward (the figures do not change)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error too")
    args = parser.parse_args(argv)
    try:
        result = score(args.model, args.data, checkpoint=args.checkpoint, max_rows=args.max_rows,
                       batch_size=args.batch_size, device=args.device)
    except (CheckpointError, ConfigError, DatasetFormatError, FileNotFoundError, ValueError) as error:
        report(str(error), error, debug=args.debug)
        return 2
    for name, value in result["figures"].items():
        print(f"{name}: {value:.6g}")
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
