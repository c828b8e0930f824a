"""Saved task models against our evaluator, through the tools people use: transformers' Auto classes and pipelines.

Each check loads a directory that ``--save-models`` wrote with ``AutoModelFor…`` and ``AutoTokenizer``, runs it the
way a user would (``transformers.pipeline`` for text and token classification; for SQuAD, whose pipeline
transformers 5 removed, the model and the fast tokenizer's offsets), and returns its predictions next to our
evaluator's on the same weights (our heads, our tokenizer, ``finetune.trainer.predict``) and the scores computed
from the transformers side, for the tests to compare with each other and with the report.
"""
from __future__ import annotations

import pathlib

import numpy as np
import torch
from safetensors.torch import load_file

from finetune import conll, glue, metrics, pretrained, squad
from finetune.heads import SequenceClassifier, TokenClassifier
from finetune.suite import pair_features
from finetune.task_models import conll_word_offsets
from finetune.trainer import predict

CPU = torch.device("cpu")


def load(directory: pathlib.Path, kind: str):
    """(model, tokenizer) through transformers' Auto classes; the model must take every weight of the file."""
    import transformers

    auto = {"sequence": transformers.AutoModelForSequenceClassification,
            "token": transformers.AutoModelForTokenClassification,
            "span": transformers.AutoModelForQuestionAnswering}[kind]
    model, info = auto.from_pretrained(str(directory), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval(), transformers.AutoTokenizer.from_pretrained(str(directory))


def ours(saved: pathlib.Path, checkpoint: pathlib.Path, head):
    """Our head of ``checkpoint``'s family holding the saved weights (our evaluator's model)."""
    model = head(pretrained.load_encoder(checkpoint))
    missing, unexpected = model.load_state_dict(load_file(str(saved / "model.safetensors")), strict=False)
    assert not unexpected and all(".pooler." in k for k in missing), (missing, unexpected)
    return model.eval()


def glue_parity(saved: pathlib.Path, checkpoint: pathlib.Path, task: str, examples: list, max_seq_length: int):
    """(our predictions, the pipeline's, the metrics of the pipeline's): labels as class indices, STS-B scores."""
    import transformers

    model, tokenizer = load(saved, "sequence")
    spec = glue.TASKS[task]
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=tokenizer, device=CPU)
    inputs = [e.text_a if e.text_b is None else {"text": e.text_a, "text_pair": e.text_b} for e in examples]
    outputs = pipe(inputs, batch_size=16, truncation=True)  # STS-B: the raw score, as problem_type is regression
    if spec.regression:
        theirs = np.array([o["score"] for o in outputs])
    else:
        theirs = np.array([model.config.label2id[o["label"]] for o in outputs])
    ours_tokenizer = pretrained.load_tokenizer_for(checkpoint)
    rows = [pair_features(ours_tokenizer, e.text_a, e.text_b, max_seq_length) for e in examples]
    head = ours(saved, checkpoint, lambda encoder: SequenceClassifier(encoder, spec.num_labels))
    logits = np.stack(predict(head, rows, 64, ours_tokenizer.pad_id, CPU, None))
    mine = logits[:, 0] if spec.regression else logits.argmax(-1)
    labels = np.asarray([e.label for e in examples])
    return mine, theirs, metrics.glue_metrics(task, labels, theirs)


def conll_parity(saved: pathlib.Path, checkpoint: pathlib.Path, sentences: list, max_seq_length: int):
    """(our IOB2 tags per sentence made well-formed, the tags the pipeline's entities give, the pipeline's entities
    per sentence). ``aggregation_strategy="first"`` on CoNLL's words, as our evaluation reads them."""
    pipe, tokenizer, ours_tokenizer, head = _token_models(saved, checkpoint, "first")
    mine, theirs, entities = [], [], []
    for sentence in sentences:
        words = list(sentence.words)
        encoding = tokenizer(words, is_split_into_words=True, return_offsets_mapping=True, truncation=True)
        offsets = conll_word_offsets(encoding.word_ids(), encoding["offset_mapping"], encoding.tokens())
        # A batch of one sentence (a bare list of words reads as a batch of words); one per call, as the pipeline
        # applies a given offset_mapping to the first sentence of a batch only.
        (found,) = pipe([words], is_split_into_words=True, offset_mapping=[offsets])
        entities.append(found)
        theirs.append(_tags_of(found, words))
        mine.append(_our_tags(head, ours_tokenizer, words, max_seq_length))
    return mine, theirs, entities


def _token_models(saved: pathlib.Path, checkpoint: pathlib.Path, aggregation: str):
    """(the saved token classifier's pipeline with ``aggregation_strategy=aggregation``, its tokenizer, our
    tokenizer, our head holding the saved weights)."""
    import transformers

    model, tokenizer = load(saved, "token")
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=tokenizer, device=CPU,
                                 aggregation_strategy=aggregation)
    head = ours(saved, checkpoint, lambda encoder: TokenClassifier(encoder, len(conll.LABELS)))
    return pipe, tokenizer, pretrained.load_tokenizer_for(checkpoint), head


def _our_tags(head, tokenizer, words: list[str], max_seq_length: int) -> list[str]:
    """Our evaluator's IOB2 tags of one sentence: each word at its first sub-token."""
    features = conll.encode_sentence(words, tokenizer, max_seq_length)
    (logits,) = predict(head, [features], 1, tokenizer.pad_id, CPU, None)
    tags = conll.words_from_token_predictions([conll.LABELS[i] for i in logits.argmax(-1)], features["word_starts"])
    return conll.iob1_to_iob2(tags)  # an I-X that starts an entity (conlleval's reading) written B-X


def conll_parity_by_tokens(saved: pathlib.Path, checkpoint: pathlib.Path, sentences: list, max_seq_length: int):
    """``conll_parity`` for a SentencePiece tokenizer, whose sub-words the pipeline cannot tell: transformers knows
    them only by a WordPiece or BPE prefix, and its fallback (a token not after a space) makes "▁" "," two words.
    So the pipeline gives every token's label (``aggregation_strategy="none"``) and each word is read at its first
    token, found by the tokenizer's ``word_ids()`` (docs/finetuning.md shows this). (our tags, the pipeline's,
    the pipeline's labelled tokens per sentence)."""
    pipe, tokenizer, ours_tokenizer, head = _token_models(saved, checkpoint, "none")
    mine, theirs, labelled = [], [], []
    for sentence in sentences:
        words = list(sentence.words)
        (found,) = pipe([words], is_split_into_words=True)
        labelled.append(found)
        by_token = {entity["index"]: entity["entity"] for entity in found}  # tokens labelled O are left out
        word_ids = tokenizer(words, is_split_into_words=True, truncation=True).word_ids()
        first = {word: index for index, word in reversed(list(enumerate(word_ids))) if word is not None}
        theirs.append(conll.iob1_to_iob2([by_token.get(first[i], "O") if i in first else "O"
                                          for i in range(len(words))]))
        mine.append(_our_tags(head, ours_tokenizer, words, max_seq_length))
    return mine, theirs, labelled


def _tags_of(entities: list[dict], words: list[str]) -> list[str]:
    """IOB2 tags per word of the pipeline's entities (character spans in the words joined by spaces)."""
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
    tags = ["O"] * len(words)
    for entity in entities:
        inside = [i for i, s in enumerate(starts) if entity["start"] <= s < entity["end"]]
        assert inside and starts[inside[0]] == entity["start"], (entity, words)  # entities start at a word
        for position, i in enumerate(inside):
            tags[i] = ("B-" if position == 0 else "I-") + entity["entity_group"]
    return tags


def squad_answers(saved: pathlib.Path, examples: list, *, max_seq_length: int, n_best_size: int,
                  max_answer_length: int) -> dict[str, str]:
    """Answers of the saved model loaded with AutoModelForQuestionAnswering and AutoTokenizer, decoded as
    transformers' extractive recipe does (question and context through the fast tokenizer, the answer cut from
    the context by its offsets) with our protocol's settings: spans of at most ``max_answer_length`` tokens among
    the ``n_best_size`` best context starts and ends. One window per question (the tests' contexts fit one)."""
    model, tokenizer = load(saved, "span")
    answers = {}
    for example in examples:
        encoding = tokenizer(example.question, example.context, truncation="only_second", max_length=max_seq_length,
                             return_offsets_mapping=True, return_overflowing_tokens=True, return_tensors="pt")
        assert len(encoding["input_ids"]) == 1, "the tests' contexts fit one window"
        offsets = encoding.pop("offset_mapping")[0].tolist()
        context = np.array([s == 1 for s in encoding.sequence_ids(0)])
        encoding.pop("overflow_to_sample_mapping", None)
        with torch.no_grad():
            output = model(**encoding)
        start = np.where(context, output.start_logits[0].numpy(), -np.inf)
        end = np.where(context, output.end_logits[0].numpy(), -np.inf)
        starts, ends = (np.argsort(-row, kind="stable")[:n_best_size] for row in (start, end))
        pairs = [(start[s] + end[e], s, e) for s in starts for e in ends if 0 <= e - s < max_answer_length]
        _, s, e = max(pairs, key=lambda pair: pair[0])
        answers[example.qid] = example.context[offsets[s][0]:offsets[e][1]]
    return answers


def squad_examples(path: pathlib.Path) -> tuple[list, list]:
    return squad.load_squad_json(str(path))
