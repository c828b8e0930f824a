"""Where a run builds its dataset and how it is published: the staging location, and after the shards the dead
letters, the config and the manifest (written last: it marks a finished dataset), then the atomic rename."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import uuid

from common import configlib, schema, storage
from common.errors import InputError
from common.objectives import ObjectiveEntry
from common.preprocess_config import InstanceConfig, PreprocessConfig
from preprocess import dedup, docstore, mixture, readers, shards
from preprocess.executors.beamrun import WorkerLog
from preprocess.executors.plan import Plan
from preprocess.layout import EVAL_DIR, HELDOUT_NAME, INDEX_NAME, SHARD_PLAN_NAME
from preprocess.stages.barrier import read_metas

LOG = logging.getLogger("preprocess")


def staging_for(output: str) -> str:
    """Where a run builds its dataset: DIR.incomplete next to a local DIR (renamed into place when complete);
    on object stores DIR itself, where the manifest, written last, marks a finished dataset."""
    if storage.is_local(output):
        staging = storage.local_path(output).rstrip("/") + ".incomplete"
        os.makedirs(staging, exist_ok=True)
        return staging
    return output


def prepare_output(output: str, overwrite: bool) -> str:
    """Return an empty staging location; refuse to clobber a finished dataset unless asked to."""
    if storage.exists(storage.join(output, schema.MANIFEST_NAME)) and not overwrite:
        raise InputError(f"{output} already holds a finished dataset; pass --overwrite or choose another --output")
    if storage.is_local(output):
        storage.remove_tree(storage.local_path(output).rstrip("/") + ".incomplete")  # left by an interrupted run
    else:
        storage.remove_tree(output)  # object stores: files without a manifest are an unfinished run
    return staging_for(output)


def publish(staging: str, output: str) -> None:
    if staging == output:
        return
    output = storage.local_path(output).rstrip("/")
    trash = None
    if os.path.exists(output):
        trash = f"{output}.old-{uuid.uuid4().hex[:8]}"
        os.rename(output, trash)
    os.rename(staging, output)
    if trash:
        storage.remove_tree(trash)


def discard_failed(staging: str, output: str, log: WorkerLog) -> None:
    """After a failure: remove what would look like a dataset, point at Beam's log."""
    if staging != output or not storage.exists(storage.join(output, schema.MANIFEST_NAME)):
        storage.remove_tree(staging)
    if log.path and os.path.getsize(log.path):
        LOG.warning("Apache Beam's log of this run: %s", log.path)
    elif log.path:
        os.unlink(log.path)  # nothing in it


def publish_dataset(cfg: PreprocessConfig, tok, plan: Plan, output: str, started: float, log: WorkerLog) -> dict:
    """After the shards of ``plan`` are written: dead letters, config and manifest (written last), then publish
    ``plan.staging`` as ``output``."""
    work, staging = plan.work, plan.staging
    index_data = storage.read_json(storage.join(work, INDEX_NAME))
    counts = {b: (c, d) for b, c, d in index_data["counts"]}
    num_docs, corpus, group_bits = index_data["bucket_offsets"][-1], index_data["corpus"], index_data["group_bits"]
    documents = docstore.add_counts(list(read_metas(storage.join(work, docstore.COUNTS_DIR)).values()))
    documents = with_duplicates(documents, [dup for _, dups in counts.values() for dup in dups])
    documents = with_text_duplicates(documents, dedup.read_summary(work))
    stats: dict = {}
    for meta in read_metas(storage.join(work, "pieces")).values():
        stats = shards.merge_counts(stats, meta["stats"])
    total_rows = sum(storage.read_json(storage.join(work, SHARD_PLAN_NAME))["group_rows"])
    shard_meta_dir = storage.join(work, "shards")
    shard_entries = sorted(read_metas(shard_meta_dir).values(), key=lambda e: e["name"])

    with storage.open_write(storage.join(staging, schema.DEAD_LETTERS_NAME), binary=False) as handle:
        for letter in documents["dead_letters"]:
            handle.write(json.dumps(letter, sort_keys=True) + "\n")
    with storage.open_write(storage.join(staging, schema.CONFIG_NAME), binary=False) as handle:
        handle.write(configlib.to_yaml(cfg))

    planned = read_metas(storage.join(work, "planned")).values()
    stats = {**stats, "sop_dropped_chunks": sum(meta.get("sop_dropped_chunks", 0) for meta in planned)}
    manifest = _manifest(cfg, tok, plan.files, documents, counts, num_docs, corpus, stats, shard_entries,
                         total_rows, plan.bucket_bits, group_bits)
    if "languages" in index_data:  # a multilingual run: each language's corpus, mix and rows
        manifest["languages"] = _languages(index_data["languages"], planned)
    manifest["sources"] = _sources(index_data.get("mixture"), documents["sources"], planned)
    if plan.heldout.enabled:
        _add_evaluation(manifest, plan, index_data)
    storage.remove_tree(work)
    manifest["summary"]["wall_seconds"] = round(time.time() - started, 3)
    manifest["summary"]["corpus_tokens_per_second"] = round(corpus["tokens"] / max(1e-9, time.time() - started), 1)
    storage.write_json(storage.join(staging, schema.MANIFEST_NAME), manifest)  # written last: marks completion
    publish(staging, output)
    if log.path:
        os.unlink(log.path)
    return manifest


def _add_evaluation(manifest: dict, plan: Plan, index_data: dict) -> None:
    """The manifest's ``evaluation``: the held-out split's selection, documents, rows, tokens, statistics and shards
    (named from the dataset directory); the training documents' statistics count what the split left out."""
    evaluation = plan.evaluation()
    split = storage.read_json(storage.join(plan.work, HELDOUT_NAME))
    left_out = sum(len(ids) for ids in index_data.get("heldout_dropped", {}).values())
    stats: dict = {}
    for meta in read_metas(storage.join(evaluation.work, "pieces")).values():
        stats = shards.merge_counts(stats, meta["stats"])
    planned = read_metas(storage.join(evaluation.work, "planned")).values()
    stats["sop_dropped_chunks"] = sum(meta.get("sop_dropped_chunks", 0) for meta in planned)
    rows = sum(storage.read_json(storage.join(evaluation.work, SHARD_PLAN_NAME))["group_rows"])
    entries = sorted(read_metas(storage.join(evaluation.work, "shards")).values(), key=lambda e: e["name"])
    selection = {source: {key: value for key, value in dataclasses.asdict(wanted).items() if value}
                 for source, wanted in plan.heldout.by_source().items() if wanted.enabled}
    manifest["evaluation"] = {
        "selection": {"seed": split["seed"], **selection}, "masking": evaluation.instance_cfg.masking,
        "documents": split["documents"], "sources": split["sources"],
        "text_duplicates_dropped": left_out - split["documents"], "rows": rows, "tokens": stats.get("tokens", 0),
        "shards": [{**entry, "name": f"{EVAL_DIR}/{entry['name']}"} for entry in entries],
        "statistics": _instance_statistics(evaluation.instance_cfg, stats, rows)}
    documents = manifest["statistics"]["documents"]
    documents.update(read=documents["read"] + left_out, heldout=split["documents"],
                     heldout_text_duplicates=left_out - split["documents"])
    manifest["summary"].update(evaluation_documents=split["documents"], evaluation_rows=rows)


def _languages(mix: dict, planned) -> dict:
    """The manifest's ``languages``: each language's corpus counts (documents, sentences, tokens), its share of the
    corpus and its smoothed share (``preprocess.languages.language_mix``), its sampling rate, and the rows it starts
    (with their tokens of the language, for packed rows) as planned by the instance stage."""
    rows: dict = {}
    for meta in planned:
        rows = shards.merge_counts(rows, meta.get("languages", {}))
    out = {}
    for language, entry in mix.items():
        made = rows.get(language, {})
        out[language] = {**entry, "rows": made.get("rows", 0),
                         **({"instance_tokens": made["tokens"]} if "tokens" in made else {})}
    return out


def _sources(mix: dict | None, counts: dict[str, dict], planned) -> dict:
    """The manifest's ``sources``: per source its documents, sentences and tokens read, its share of the corpus,
    the share of the rows' tokens asked for (the ``mixture`` section's, else its own share) and its rate, the rows it
    starts and its own tokens in them, and the share of those tokens it got (``mixture.realised``)."""
    if mix is None:
        kept = {name: entry for name, entry in counts.items() if entry["documents"] > 0}
        total = sum(entry["tokens"] for entry in kept.values())
        mix = mixture.mix_entries(kept, {name: entry["tokens"] / total if total else 0.0
                                         for name, entry in kept.items()}, "tokens")
    made: dict = {}
    for meta in planned:
        made = shards.merge_counts(made, meta.get("sources", {}))
    return {name: {key: value for key, value in entry.items() if key not in ("skipped", "failed")}
            for name, entry in mixture.realised(mix, made).items()}


def _fraction(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 6) if denominator else 0.0


def objective_of(cfg: InstanceConfig) -> ObjectiveEntry:
    """What the dataset's rows are for (the manifest's ``objective``), from the instance recipe."""
    return ObjectiveEntry(kind=cfg.kind, sentence_objective=cfg.sentence_objective, masking=cfg.masking,
                          mask_unit=cfg.mask_unit, masked_lm_prob=cfg.masked_lm_prob,
                          max_predictions_per_seq=cfg.max_predictions_per_seq,
                          mask_token_fraction=cfg.mask_token_fraction, random_token_fraction=cfg.random_token_fraction)


def _instance_statistics(cfg: InstanceConfig, stats: dict, total_rows: int) -> dict:
    """The instances' statistics for the objective, from the pieces' counts (``shards.instance_stats``, merged, with
    the planning's ``sop_dropped_chunks``): the sentence-level labels' balance (NSP: random next; SOP: swapped, and
    the one-token chunks dropped), the masks (static masking only), truncation of pairs, and for packed rows the
    document blocks per row and the fill (tokens over rows x max_seq_length: 1 is no padding)."""
    stats = dict(stats)
    dropped = stats.pop("sop_dropped_chunks", 0)
    labels = stats.pop("next_sentence", {})
    out: dict = {}
    if cfg.sentence_objective == "nsp":
        stats["next_sentence"] = labels
        out["next_sentence_random_fraction"] = _fraction(labels.get("random", 0), total_rows)
    elif cfg.sentence_objective == "sop":
        stats["sentence_order"] = {"in_order": labels.get("actual", 0), "swapped": labels.get("random", 0)}
        out["sentence_order_swapped_fraction"] = _fraction(labels.get("random", 0), total_rows)
        out["sop_dropped_chunks"] = dropped
    masked = stats.get("masked", {})
    positions = masked.get("positions", 0)
    if cfg.masking == "static":
        out["masked_fraction"] = _fraction(positions, stats.get("tokens", 0))
        out["mask_split"] = {k: _fraction(masked.get(k, 0), positions) for k in ("mask_token", "random_token",
                                                                                  "unchanged")}
    else:
        stats.pop("masked", None)  # nothing is masked in the shards
    if cfg.kind == "pairs":
        out["truncated_fraction"] = _fraction(stats.get("truncated", 0), total_rows)
    else:
        stats.pop("truncated", None)  # packed rows cut documents where a row is full, they truncate nothing
        out["documents_per_row"] = _fraction(stats.get("document_blocks", 0), total_rows)
        out["fill_fraction"] = _fraction(stats.get("tokens", 0), total_rows * cfg.max_seq_length)
    return {"instances": stats, **out}


def with_duplicates(documents: dict, duplicates: list) -> dict:
    """The documents' counts (``docstore.add_counts``) with the copies of a repeated id that the index dropped
    ((doc_id, source) each): of a built-in source skipped "duplicate_id", as they always were (a dump may hold a page
    twice); of an ``inputs:`` source failed "duplicate_id" with a dead letter each, since there the ids are the
    records' own and a repeat is a fault of the data. Each source's count of documents is then without them."""
    documents = {**documents, "skipped": dict(documents["skipped"]), "failed": dict(documents["failed"]),
                 "dead_letters": list(documents["dead_letters"]),
                 "sources": {name: {**entry, "skipped": dict(entry["skipped"]), "failed": dict(entry["failed"])}
                             for name, entry in documents.get("sources", {}).items()}}
    for doc_id, source in duplicates:
        name = readers.source_of(doc_id)
        outcome = "skipped" if doc_id.split(":", 1)[0] in readers.BUILTIN_KEYS else "failed"
        entry = documents["sources"].setdefault(name, docstore.no_source_counts())
        entry["documents"] -= 1
        for counts in (documents, entry):
            counts[outcome]["duplicate_id"] = counts[outcome].get("duplicate_id", 0) + 1
        if outcome == "failed":
            documents["dead_letters"].append({"source": source, "doc_id": doc_id, "reason": "duplicate_id",
                                              "detail": f"{source}: the id repeats within source {name}; one copy "
                                                        "is kept (the first by file name and text)"})
    documents["dead_letters"].sort(key=lambda letter: (letter["source"], letter["doc_id"]))
    return documents


def with_text_duplicates(documents: dict, summary: dict | None) -> dict:
    """The documents' counts with the duplicates of text that ``preprocess.dedup`` dropped: skipped
    "exact_duplicate" and "near_duplicate", in all and per source, and each source's documents, sentences and tokens
    without them."""
    if not summary:
        return documents
    sources = dedup.without(documents["sources"], summary)
    skipped = dict(documents["skipped"])
    for name, removed in summary["sources"].items():
        of_source = sources[name]["skipped"] = dict(sources[name]["skipped"])
        for kind in ("exact", "near"):
            if removed[kind]:
                of_source[f"{kind}_duplicate"] = removed[kind]
                skipped[f"{kind}_duplicate"] = skipped.get(f"{kind}_duplicate", 0) + removed[kind]
    return {**documents, "skipped": skipped, "sources": sources}


def _manifest(cfg, tok, sized, documents, counts, num_docs, corpus, stats, shard_entries, total_rows,
              bucket_bits, group_bits) -> dict:
    skipped, failed = dict(documents["skipped"]), dict(documents["failed"])
    read = num_docs + sum(skipped.values()) + sum(failed.values())
    return {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "objective": dataclasses.asdict(objective_of(cfg.instances)),
        "tokenizer": {**tok.identity(), "dir": schema.TOKENIZER_DIR},
        "token_dtype": schema.token_numpy_dtype(tok.vocab_size),
        "max_seq_length": cfg.instances.max_seq_length,
        "parameters": configlib.to_dict(cfg),
        "inputs": [{"kind": key, "name": readers.reader_of(key).label(uri), "bytes": size} for key, uri, size in sized],
        "rows": total_rows,
        "tokens": stats.get("tokens", 0),
        "shards": shard_entries,
        "layout": {"bucket_bits": bucket_bits, "group_bits": group_bits},
        "statistics": {
            "documents": {"read": read, "used": num_docs, "skipped": skipped, "failed": failed,
                          "sources": dict(sorted(documents["sources"].items()))},
            "corpus": corpus,
            **_instance_statistics(cfg.instances, stats, total_rows),
        },
        "summary": {"documents": num_docs, "instances": total_rows, "corpus_tokens": corpus["tokens"],
                    "instance_tokens": stats.get("tokens", 0), "shards": len(shard_entries)},
    }


__all__ = ["discard_failed", "prepare_output", "publish", "publish_dataset", "staging_for"]
