"""The report says what a run is: the encoder's size, the examples per task, the BERT paper's columns only where
the protocol is the paper's (the whole official dev set after the whole train set), a note (the demo's), and the
task models it saved."""
from finetune import report


def _result(task: str, eval_examples: int, max_train_examples: int = 0, **extra) -> dict:
    return {"task": task, "benchmark": "glue", "seeds": [1], "mean": {"accuracy": 0.9}, "std": {"accuracy": 0.0},
            "runs": [{"seed": 1, "metrics": {"accuracy": 0.9}}], "seconds": 1.0, "train_examples": 224,
            "eval_examples": eval_examples, "training": {"max_train_examples": max_train_examples}, **extra}


def _markdown(results: list[dict], **options) -> tuple[dict, str]:
    built = report.build(results, checkpoint="ckpt", seconds=1.0, seeds=[1], config={}, **options)
    return built, report.markdown(built)


def test_paper_columns_stand_only_beside_the_official_protocol():
    built, markdown = _markdown([_result("sst2", 872), _result("rte", 90)],
                                model={"model_type": "bert", "parameters": 716_800})
    assert [r["comparable_with_paper"] for r in built["results"]] == [True, False]
    assert "| sst2 | accuracy | 90.00 ± 0.00 | 90.0 | 93.5 | 94.9 | 1 s | 224 / 872 |" in markdown
    assert "| rte | accuracy | 90.00 ± 0.00 | 90.0 | – | – | 1 s | 224 / 90 |" in markdown
    assert "* rte: dev on 90 examples, not the official 277" in markdown
    assert "Model: bert encoder, 0.7 M parameters (the paper: BERT-Base 110 M parameters" in markdown
    assert "not comparable with the paper's 79.6 / 82.1" in markdown  # two tasks, one of them a sample


def test_a_training_subset_is_not_the_papers_protocol_and_a_note_opens_the_report():
    built, markdown = _markdown([_result("sst2", 872, max_train_examples=512)], note="Demo scale: synthetic data.")
    assert not built["results"][0]["comparable_with_paper"]
    assert "* sst2: dev on 872 examples, not the official 872; trained on the first 224 examples only" not in markdown
    assert "trained on the first 224 examples only" in markdown and "| – | – |" in markdown
    assert markdown.splitlines()[2] == "**Demo scale: synthetic data.**"
    assert built["note"] == "Demo scale: synthetic data."


def test_the_saved_task_models_are_listed_once_each():
    entry = {"path": "models/mnli", "seed": 2, "epoch": 1, "score": 0.84, "metric": "accuracy",
             "selected_by": "median of 3 seed(s) by accuracy"}
    failed = {"seed": 1, "epoch": 0, "score": float("nan"), "metric": "accuracy", "selected_by": "save_seed 1",
              "error": "models/.staging/rte-seed1: not saved: 3 weight tensors hold NaN or inf"}
    _, markdown = _markdown([_result("mnli_matched", 9815, saved_model=entry),
                             _result("mnli_mismatched", 9832, saved_model=entry),
                             _result("rte", 277, saved_model=failed)])
    assert markdown.count("| `models/mnli` |") == 1
    assert "| mnli_matched | `models/mnli` | 2 | 1 | accuracy 0.8400 | median of 3 seed(s) by accuracy |" in markdown
    assert "| rte | not saved: models/.staging/rte-seed1: not saved: 3 weight tensors hold NaN or inf |" in markdown
