"""Command line: ``python -m preprocess run …``, ``python -m preprocess tokenizer train …`` and
``python -m preprocess verify DIR``."""
from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time

from common import preprocess_config as config_module
from common import storage
from common.configlib import ConfigError
from common.errors import InputError, StorageError, report, storage_failure


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="build a dataset of BERT instances",
                       description="Unrecognised --options are passed to Apache Beam (e.g. --runner, "
                                   "--direct_num_workers, --direct_running_mode, --dask_client_address).")
    config_module.add_run_arguments(p)
    _add_debug(p)


def _add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (otherwise a full disk or missing permission "
                             "writes it to a file in the temporary directory that the error line names)")


def _tokenizer_parser(sub) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="train a SentencePiece vocabulary with the BERT special tokens")
    t.add_argument("--input", nargs="*", default=[], metavar="URI",
                   help="files, dirs or globs; names containing '.xml' are read as Wikipedia dumps, others as books")
    t.add_argument("--wikipedia", nargs="*", default=[], metavar="URI")
    t.add_argument("--books", nargs="*", default=[], metavar="URI")
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--output", required=True, metavar="DIR")
    t.add_argument("--lowercase", action="store_true")
    t.add_argument("--max-sentences", type=int, default=2_000_000, help="sentences sampled for training")
    t.add_argument("--seed", type=int, default=12345)
    t.add_argument("--config", help="preprocess YAML whose 'sources' section controls cleaning, whose 'inputs' "
                                    "sources are sampled too, and whose 'multilingual' section, when enabled, mixes "
                                    "the languages of the sample")
    _add_debug(t)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m preprocess", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _tokenizer_parser(sub)
    verify = sub.add_parser("verify", help="check a dataset against its manifest (every shard's size and sha256)")
    verify.add_argument("dataset", metavar="DIR")
    _add_debug(verify)
    return parser


def _summary_lines(manifest: dict, output: str) -> list[str]:
    s, st = manifest["summary"], manifest["statistics"]
    docs = st["documents"]
    evaluation = manifest.get("evaluation")
    held_out = [] if evaluation is None else [
        f"held out: {evaluation['documents']:,} documents {evaluation['sources']} "
        f"(and {evaluation['text_duplicates_dropped']:,} of the same text), {evaluation['rows']:,} evaluation rows "
        f"in {len(evaluation['shards'])} shard(s) under eval/; {evaluation['tokens']:,} tokens, masked once"]
    sources = manifest.get("sources", {})
    shares = "; ".join(f"{name} {entry['share']:.1%} -> {entry['requested_share']:.1%} -> "
                       f"{entry['realised_share']:.1%}" for name, entry in sources.items())
    mixed = []
    if len(sources) > 1:
        mixed.append(f"sources (share of the corpus -> asked -> got, of the rows' tokens): {shares}")
    return [
        f"documents: {docs['read']:,} read, {docs['used']:,} used, "
        f"{sum(docs['skipped'].values()):,} skipped {docs['skipped']}, {sum(docs['failed'].values()):,} failed {docs['failed']}",
        *held_out,
        *mixed,
        f"instances: {s['instances']:,} in {s['shards']} shard(s); {s['instance_tokens']:,} tokens; "
        + "; ".join(_objective_figures(st)),
        f"corpus: {s['corpus_tokens']:,} tokens in {s['wall_seconds']:.1f} s = {s['corpus_tokens_per_second']:,.0f} tokens/s",
        f"output: {output} (manifest.json, dead_letters.jsonl, tokenizer/)",
    ]


def _objective_figures(st: dict) -> list[str]:
    """The statistics that the dataset's objective has (``preprocess.executors.publish``), in a few words each."""
    figures = []
    if "next_sentence_random_fraction" in st:
        figures.append(f"random next {st['next_sentence_random_fraction']:.3f}")
    if "sentence_order_swapped_fraction" in st:
        figures.append(f"swapped {st['sentence_order_swapped_fraction']:.3f}")
    if "fill_fraction" in st:
        figures.append(f"fill {st['fill_fraction']:.4f}, {st['documents_per_row']:.2f} documents per row")
    if "masked_fraction" in st:
        split = st["mask_split"]
        figures.append(f"masked {st['masked_fraction']:.4f} ({split['mask_token']:.3f}/{split['random_token']:.3f}/"
                       f"{split['unchanged']:.3f})")
    else:
        figures.append("unmasked (masked by the pretraining loader)")
    return figures


def _command_run(args, beam_args: list[str]) -> int:
    from preprocess.executors import pipeline

    overrides = list(args.overrides)
    if args.parts is not None and args.max_memory is not None:
        raise InputError("--parts and --max-memory both choose the number of parts: pass one of them")
    if args.parts is not None:
        overrides.append(f"parts={args.parts}")
    if args.max_memory is not None:
        overrides.append(f"max_memory={json.dumps(args.max_memory)}")
    if args.provenance:
        overrides.append("output.provenance=true")
    cfg = config_module.load(args.config, overrides)
    tokenizer = args.tokenizer or cfg.tokenizer.path
    if not tokenizer:
        raise InputError("no tokenizer: pass --tokenizer (a dir from 'tokenizer train', a SentencePiece .model "
                         "or a WordPiece vocab.txt) or set tokenizer.path in the config")
    if args.part is not None or args.step is not None:
        return _run_step(args, cfg, tokenizer, beam_args)
    if args.wait is not None:
        raise InputError("--wait applies to --part/--step runs only")
    manifest = pipeline.run(cfg, wikipedia=args.wikipedia, books=args.books, tokenizer=tokenizer,
                            output=args.output, beam_args=beam_args, overwrite=args.overwrite,
                            verbose=args.verbose)
    print("\n".join(_summary_lines(manifest, args.output)))
    return 0


def _run_step(args, cfg, tokenizer: str, beam_args: list[str]) -> int:
    from preprocess.executors import steps

    result = steps.run_step(cfg, step=args.step, part=args.part, wikipedia=args.wikipedia, books=args.books,
                            tokenizer=tokenizer, output=args.output, beam_args=beam_args, wait_seconds=args.wait,
                            overwrite=args.overwrite, verbose=args.verbose)
    if "format" in result:  # the finish step: the dataset's manifest
        print("\n".join(_summary_lines(result, args.output)))
        return 0
    what = (f"{result['documents']:,} documents, {result['tokens']:,} tokens from {result['files']} file(s)"
            if result["step"] == "documents" else
            f"{result['instances']:,} instances from {result['units']} "
            f"{'packing stream' if cfg.instances.kind == 'full_sentences' else 'document bucket'}(s)")
    done = f"already done ({result['seconds']:.1f} s then)" if result.get("skipped") else f"{result['seconds']:.1f} s"
    print(f"{result['step']}, part {result['part']} of {result['parts']}: {what}; {done}")
    if result.get("note"):
        print(result["note"])
    if args.step:
        print(f"output: {args.output} is published by `--step finish` once every part is done")
    return 0


def _command_tokenizer_train(args) -> int:
    from preprocess import readers
    from preprocess.vocab import sample_sentences, sample_sentences_by_language, train_sentencepiece

    cfg = config_module.load(args.config) if args.config else config_module.PreprocessConfig()
    paths = {"wikipedia": list(args.wikipedia), "books": list(args.books)}
    for uri in args.input:
        paths[readers.guess_builtin(uri)].append(uri)
    inputs = tuple(cfg.inputs)
    files = readers.input_files(paths, inputs)
    if not files:
        raise InputError("no input: pass --input (or --wikipedia / --books), or list sources under inputs: in the "
                         "--config")
    started = time.time()
    if cfg.multilingual.enabled:  # the languages mixed as the dataset's rows will be (multilingual.alpha)
        sentences, mix = sample_sentences_by_language(files, cfg.sources, cfg.multilingual, args.max_sentences,
                                                      args.seed, inputs)
        print("sample by language: " + ", ".join(f"{language} {entry['sampled']:,} of {entry['sentences']:,} "
                                                 "sentences" for language, entry in mix.items()))
    else:
        sentences = sample_sentences(files, cfg.sources, args.max_sentences, args.seed, inputs)
    tokenizer = train_sentencepiece(sentences, args.vocab_size, args.output, lowercase=args.lowercase)
    identity = tokenizer.identity()
    print(f"tokenizer: SentencePiece, {identity['vocab_size']:,} pieces, trained on {len(sentences):,} sentences "
          f"from {len(files)} file(s) in {time.time() - started:.1f} s; vocab sha256 {identity['vocab_sha256'][:16]}…")
    print(f"output: {args.output}")
    return 0


def _storage_failure(exc: BaseException, args: argparse.Namespace) -> StorageError | None:
    """A full disk or missing permission as one line naming the path (the command's output when the error names
    none), with the remedy; None for other errors."""
    if args.command == "verify":
        return storage_failure(exc, path=args.dataset, doing="verifying the dataset", writing=False)
    failure = storage_failure(exc, path=args.output)
    if failure is None or isinstance(exc, StorageError) or not failure.path.startswith(args.output.rstrip("/")):
        return failure  # said by the pipeline already, or an input named by the error
    doing = "writing the dataset" if args.command == "run" else "writing the tokenizer"
    return storage_failure(exc, path=args.output, doing=doing, fix="choose another --output",
                           note="nothing was published" if args.command == "run" else None)


def _clear_message(exc: BaseException, args: argparse.Namespace, beam_args: list[str] = ()) -> str | None:
    """The one-line message of an expected error, also when Beam wrapped it in a worker traceback. ``args``: the
    command line, whose output is named for a full disk or missing permission whose error names no file;
    ``beam_args``: its Beam options, whose Dask scheduler is named when the cluster failed."""
    from preprocess.executors.beamargs import option
    from preprocess.executors.daskfaults import dask_failure

    dask = dask_failure(exc, option(list(beam_args), "--dask_client_address"))
    if dask is not None:
        return dask
    if isinstance(exc, (InputError, ConfigError)):
        return str(exc).replace(InputError.MARKER, "").strip()
    text = str(exc)
    if InputError.MARKER in text:
        tail = text.split(InputError.MARKER, 1)[1]
        return tail.strip().splitlines()[0].strip().rstrip("'\"]")
    failure = _storage_failure(exc, args)
    if failure is not None:
        return str(failure)
    store = storage.store_failure(exc)
    if store is not None:  # retried as common.storage.s3_retries says, and still failing
        output = getattr(args, "output", None) or "the run"
        return (f"the object store failed for {output}, after its retries: {store}; nothing was published. "
                "Check the store (or raise AWS_MAX_ATTEMPTS for a long throttling) and run again")
    from common.errors import DatasetFormatError
    from common.writelock import OutputLockedError

    if isinstance(exc, (DatasetFormatError, FileNotFoundError, PermissionError, OutputLockedError)):
        return str(exc)
    return None


class _DropNoise(logging.Filter):
    """Beam warns about optional client libraries (Google Cloud, MongoDB) on every import; not news to our users."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("apitools not found", "Could not find a compatible bson"))


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropNoise())
    if not verbose:
        # Beam logs a worker's whole traceback before the error reaches us; we print one clear line instead
        # (and re-raise with the full traceback when the error is not an expected one).
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    logging.getLogger("preprocess").setLevel(logging.INFO)  # our own notes, e.g. what --max-memory chose


def load_pipeline_modules() -> None:
    """Import Apache Beam and the pipeline modules (most of a run's start-up time), then take the objects they
    created out of the cycle collector's view (``gc.freeze``). Beam's import alone leaves over 100,000 objects
    that live as long as the process; unfrozen, every full collection of a long run traverses them again, a cost
    per input byte (the local pool's forked workers inherit the frozen set too)."""
    import preprocess.executors.pipeline  # noqa: F401

    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    if args.command != "run" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "run":
            from common.tokenizer import keep_batches_on_this_thread

            keep_batches_on_this_thread()  # before any worker starts: they inherit it
            load_pipeline_modules()
            return _command_run(args, rest)
        if args.command == "verify":
            from common.verify import verify_dataset

            print(verify_dataset(args.dataset))
            return 0
        return _command_tokenizer_train(args)
    except KeyboardInterrupt:
        print("interrupted: nothing was published", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - turned into one clear line when it is an expected error
        message = _clear_message(exc, args, rest)
        if message is None:
            raise
        report(message, exc, debug=args.debug,
               traceback_file="preprocess" if storage_failure(exc) is not None else None)
        return 2
