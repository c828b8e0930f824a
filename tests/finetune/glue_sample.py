"""`finetune glue` on the bundled SST-2 sample with the tiny config, as the finetuning tests run it."""
import pathlib

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples"
ONE_SEED_ONE_EPOCH = ("--set", "seeds=[3]", "--set", "glue.training.epochs=1")  # a quick run that writes a report


def sst2_argv(checkpoint, output, *more: str) -> list[str]:
    """The arguments after ``python -m finetune`` that finetune ``checkpoint`` on the sample into ``output``."""
    return ["glue", "--checkpoint", str(checkpoint), "--tasks", "sst2", "--data", str(SAMPLES),
            "--config", "configs/finetune/tiny.yaml", "--output", str(output), *more]
