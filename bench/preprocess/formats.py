"""Benchmark of the preprocessing job on the formats users hold their corpora in, at scale: JSON lines and one large
.jsonl.zst file.

    python -m bench.preprocess.formats [--copies 8] [--reps 3] [--zst-gib 1] [--max-memory 4G] [--work DIR]
                                       [--data DIR] [--results DIR]

1. JSON lines at scale: the shared data's documents (the Wikipedia slice and the books, cleaned by their own
   readers) written as C4-style JSON lines (``{"id", "text"}``, one uncompressed file per copy, which the job cuts
   into byte ranges), ``--copies`` times with distinct ids. Measured as ``bench.preprocess.scale`` measures the
   Wikipedia path (``bench.preprocess.runs``): the irreducible work (read + JSON parse + clean + sentence split +
   tokenize) standalone, then the pipeline in-memory and with two worker processes; the CPU ratio is the median of
   ``--reps`` repetitions' own ratios, and both modes must write the same shards.
2. ``--max-memory`` on that input, in-memory: the smallest budget the estimate accepts; the peak must stay under it
   and the shards must be byte-identical.
3. One large .jsonl.zst file (``--zst-gib`` GiB as stored; zstd level 3, the zstd tool's default) of copies of the
   same documents with distinct ids, run with two worker processes under ``--max-memory``: each process's peak and
   CPU (the two share the file through its stride pieces), the parts chosen, and the same for a file a quarter of
   the size: a worker's peak must stay under its share of the budget and not grow with the file.

Writes ``bench/results/preprocess-formats-<machine>.json`` and prints a summary. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from bench import record
from bench.cpu import CONTENDED_LOAD, wait_for_quiet
from bench.preprocess.inputs import prepare_tokenizer, real_inputs
from bench.preprocess.runs import CONFIG, MODES, Setting, irreducible, median, mib, run_pipeline
from bench.processes import run_measured

MEASURED_CODE = ("preprocess/**/*.py", "configs/preprocess/*.yaml")
TARGET_CPU_RATIO = 1.3  # the Wikipedia path's (bench/results/preprocess-*.json)
LARGE_RUN_TIMEOUT = 3 * 3600


def clean_documents(shared: dict, config: str) -> list[bytes]:
    """The shared data's documents as cleaned by their own readers, each as its text's JSON string (bytes)."""
    from common import preprocess_config
    from preprocess import readers
    from preprocess.records import Rejected

    cfg = preprocess_config.load(config).sources
    texts = []
    for key, uri in readers.builtin_files({"wikipedia": shared["wiki"], "books": shared["books"]}):
        reader = readers.reader_of(key)
        for raw in reader.read(uri, None, None, cfg, {}):
            if not isinstance(raw, Rejected):
                text = reader.clean(raw.text)
                if text.strip():
                    texts.append(json.dumps(text).encode())
    return texts


def _record(copy: str, index: int, text: bytes) -> bytes:
    return b'{"id": "%s-%d", "text": %s}\n' % (copy.encode(), index, text)


def write_jsonl_copies(texts: list[bytes], root: Path, copies: int) -> list[str]:
    """``copies`` files ``web-N.jsonl`` of the documents with ids ``N-i``, each written whole or not at all."""
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for copy in range(1, copies + 1):
        path = root / f"web-{copy}.jsonl"
        if not path.exists():
            temporary = path.with_suffix(".tmp")
            with open(temporary, "wb") as out:
                for index, text in enumerate(texts):
                    out.write(_record(str(copy), index, text))
            temporary.rename(path)
        files.append(str(path))
    return files


def write_zst(texts: list[bytes], path: Path, stored_bytes: int) -> dict:
    """A .jsonl.zst file of copies of the documents (ids ``zN-i``), compressed until it holds ``stored_bytes``;
    reused while its stamp says so. Its stored and decompressed sizes, and the copies it holds."""
    import zstandard

    stamp = path.with_name(path.name + ".stamp.json")
    if path.exists() and stamp.exists() and json.loads(stamp.read_text())["target_bytes"] == stored_bytes:
        return json.loads(stamp.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    decompressed, copy = 0, 0
    with open(temporary, "wb") as raw:
        with zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as writer:
            while raw.tell() < stored_bytes:
                copy += 1
                for index, text in enumerate(texts):
                    line = _record(f"z{copy}", index, text)
                    writer.write(line)
                    decompressed += len(line)
    temporary.rename(path)
    info = {"target_bytes": stored_bytes, "stored_bytes": path.stat().st_size, "decompressed_bytes": decompressed,
            "copies": copy, "level": 3}
    stamp.write_text(json.dumps(info))
    return info


def source_config(path: Path, files_glob: str) -> str:
    """The benchmark's config (``runs.CONFIG``) with one JSON lines source, ``web``, of the files ``files_glob``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((record.REPO / CONFIG).read_text() + (
        f"inputs:\n  - {{name: web, format: jsonl, paths: ['{files_glob}'], id_field: id}}\n"))
    return str(path)


def repetitions(setting: Setting, reps: int, say) -> tuple[list[dict], dict[str, list[dict]]]:
    """A run of each kind unmeasured (it caches the modules' bytecode), then ``reps`` measured repetitions."""
    irreducible(setting, setting.logs / "jsonl-warmup-irreducible.log")
    run_pipeline(setting, setting.work / "out" / "jsonl-warmup", MODES["workers_2"],
                 setting.logs / "jsonl-warmup.log")
    irr_runs, runs = [], {mode: [] for mode in MODES}
    for rep in range(reps):
        irr_runs.append(irreducible(setting, setting.logs / f"jsonl-irreducible-{rep}.log"))
        say(f"irreducible #{rep + 1}: {irr_runs[-1]['cpu_s']:.2f} CPU-s, {irr_runs[-1]['corpus_tokens']:,} tokens")
        for mode, beam in MODES.items():
            r = run_pipeline(setting, setting.work / "out" / f"jsonl-{mode}", beam,
                             setting.logs / f"jsonl-{mode}-{rep}.log")
            r["cpu_ratio_vs_irreducible"] = round(r["cpu_s"] / irr_runs[-1]["cpu_s"], 3)
            runs[mode].append(r)
            say(f"{mode} #{rep + 1}: wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s (ratio "
                f"{r['cpu_ratio_vs_irreducible']:.3f}), peak {mib(r['peak_tree_rss_bytes'])} MiB, other load "
                f"{r['foreign_load_cores']:.2f} cores")
    return irr_runs, runs


def summary_of(runs: list[dict], irr_runs: list[dict]) -> dict:
    clean = [r for r, i in zip(runs, irr_runs) if not r["contended"] and not i["contended"]] or runs
    return {"wall_s": median(clean, "wall_s"), "cpu_s": median(clean, "cpu_s"),
            "cpu_ratio_vs_irreducible": median(clean, "cpu_ratio_vs_irreducible"),
            "peak_tree_rss_bytes": max(r["peak_tree_rss_bytes"] for r in clean),
            "corpus_tokens_per_cpu_s": round(clean[0]["corpus_tokens"] / median(clean, "cpu_s"), 1),
            "medians_over": f"{len(clean)} uncontended run(s)" if clean is not runs else f"{len(runs)} run(s)",
            "shard_sha256_first": runs[0]["shard_sha256"][:3]}


def smallest_budget_run(setting: Setting, reference: dict) -> dict:
    """In-memory under the smallest ``--max-memory`` the estimate accepts for these files."""
    from preprocess.executors import part_budget
    from preprocess.executors.plan import resolve_inputs
    from common import preprocess_config

    sized = resolve_inputs([], [], tuple(preprocess_config.load(setting.config).inputs))
    budget = part_budget.estimated_peak(sized, len(sized))
    log = setting.logs / "jsonl-budget.log"
    r = run_pipeline(setting, setting.work / "out" / "jsonl-budget", [*MODES["workers_1"], "--max-memory",
                                                                     str(budget)], log)
    chosen = re.search(r"max-memory \S+: \d+ parts? \(estimated peak \S+ per part\)", log.read_text())
    return {"budget_bytes": budget, "parts_chosen": r["parts"], "log_line": chosen and chosen.group(0),
            "peak_tree_rss_bytes": r["peak_tree_rss_bytes"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
            "peak_over_budget": round(r["peak_tree_rss_bytes"] / budget, 3),
            "under_budget": r["peak_tree_rss_bytes"] <= budget,
            "shards_identical": r["shard_sha256"] == reference["shard_sha256"]}


def large_file_run(setting: Setting, zst: Path, info: dict, budget: str, name: str) -> dict:
    """The .jsonl.zst file alone, two worker processes under ``--max-memory budget``: each process's peak and CPU."""
    from common import sizes

    config = source_config(setting.work / f"zst-{name}.yaml", str(zst))
    output = setting.work / "out" / f"zst-{name}"
    shutil.rmtree(output, ignore_errors=True)
    log = setting.logs / f"zst-{name}.log"
    cmd = [sys.executable, "-m", "preprocess", "run", "--config", config, "--tokenizer", str(setting.tokenizer),
           "--output", str(output), "--overwrite", *MODES["workers_2"], "--max-memory", budget]
    load_before = wait_for_quiet(setting.quiet_wait)
    run = run_measured(cmd, log, timeout=LARGE_RUN_TIMEOUT)
    manifest = json.loads((output / "manifest.json").read_text())
    shutil.rmtree(output, ignore_errors=True)  # gigabytes of shards; their figures are in the manifest
    chosen = re.search(r"max-memory \S+: \d+ parts? \(estimated peak \S+ per part\)", log.read_text())
    # The driver starts first; a worker that shares the file does about half of the run's work.
    workers = [p for p in run["process_cpu_s"][1:] if p["cpu_s"] >= 0.25 * run["cpu_s"]]
    per_process = sizes.parse_size(budget) // 2
    return {"file": info, "budget": budget, "budget_per_process_bytes": per_process,
            "parts_chosen": manifest["parameters"]["parts"], "log_line": chosen and chosen.group(0),
            "wall_s": run["wall_s"], "cpu_s": run["cpu_s"], "peak_tree_rss_bytes": run["peak_tree_rss_bytes"],
            "processes": run["process_cpu_s"],
            "worker_peak_rss_bytes": max(p["sampled_peak_rss_bytes"] for p in run["process_cpu_s"]),
            "workers_with_work": len(workers),
            "corpus_tokens": manifest["summary"]["corpus_tokens"], "documents": manifest["summary"]["documents"],
            "instances": manifest["summary"]["instances"],
            "corpus_tokens_per_cpu_s": round(manifest["summary"]["corpus_tokens"] / run["cpu_s"], 1),
            "foreign_load_before_cores": load_before, "foreign_load_cores": run["foreign_load_cores"],
            "contended": run["foreign_load_cores"] > CONTENDED_LOAD}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.formats", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8, help="copies of the shared data as JSON lines (default 8)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of item 1 (default 3)")
    parser.add_argument("--zst-gib", type=float, default=1.0, help="the large .jsonl.zst's stored size (0: none)")
    parser.add_argument("--max-memory", default="4G", help="the budget of the large file's runs (default 4G)")
    parser.add_argument("--skip-jsonl", action="store_true", help="only item 3 (keeps the results' items 1-2)")
    parser.add_argument("--work", type=Path, default=record.WORK / "preprocess")
    parser.add_argument("--data", type=Path, default=record.SHARED_DATA)
    parser.add_argument("--results", type=Path, default=record.RESULTS)
    parser.add_argument("--quiet-wait", type=float, default=10.0)
    parser.add_argument("--note")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - begun:7.1f}s] {message}", flush=True)

    machine = record.machine_info()
    out_file = record.results_file(args.results, "preprocess-formats", machine)
    previous = json.loads(out_file.read_text()) if out_file.exists() else {}
    results = {"benchmark": "preprocess-formats", "date": record.utc_now(), "machine": machine,
               "versions": record.versions(record.DISTRIBUTIONS["preprocess"] + ("zstandard",),
                                           ("preprocess", "configs")),
               "source_sha256": record.source_digest(MEASURED_CODE), "config": CONFIG, "note": args.note,
               "method": __doc__.split("\n\n", 2)[2].rsplit("\n\nWrites", 1)[0]}
    shared = real_inputs(args.data)
    tokenizer, _ = prepare_tokenizer(shared, work)
    texts = clean_documents(shared, str(record.REPO / CONFIG))
    say(f"{len(texts):,} documents of the shared data, {mib(sum(map(len, texts)))} MiB of JSON text")
    if args.skip_jsonl:
        results.update({key: previous[key] for key in ("jsonl", "checks") if key in previous})
    else:
        files = write_jsonl_copies(texts, work / "formats" / "jsonl", args.copies)
        config = source_config(work / "formats" / "jsonl.yaml", str(work / "formats" / "jsonl" / "web-*.jsonl"))
        setting = Setting({"wiki": [], "books": []}, tokenizer, work, args.quiet_wait, config)
        irr_runs, runs = repetitions(setting, args.reps, say)
        modes = {mode: summary_of(runs[mode], irr_runs) for mode in MODES}
        budget = smallest_budget_run(setting, runs["workers_1"][0])
        say(f"budget {mib(budget['budget_bytes'])} MiB: {budget['parts_chosen']} parts, peak "
            f"{mib(budget['peak_tree_rss_bytes'])} MiB, identical {budget['shards_identical']}")
        results["jsonl"] = {
            "copies": args.copies, "files": len(files), "bytes": sum(os.path.getsize(f) for f in files),
            "corpus_tokens": runs["workers_1"][0]["corpus_tokens"], "documents": runs["workers_1"][0]["documents_used"],
            "instances": runs["workers_1"][0]["instances"],
            "irreducible_cpu_s": median(irr_runs, "cpu_s"), "irreducible": irr_runs, "end_to_end": modes,
            "runs": runs, "memory_budget": budget}
        results["checks"] = {
            **{f"cpu_ratio_{mode}": {"value": modes[mode]["cpu_ratio_vs_irreducible"],
                                     "target": f"<= {TARGET_CPU_RATIO}",
                                     "pass": modes[mode]["cpu_ratio_vs_irreducible"] <= TARGET_CPU_RATIO}
               for mode in MODES},
            "workers_same_shards": {"pass": runs["workers_1"][0]["shard_sha256"] == runs["workers_2"][0]["shard_sha256"]},
            "budget_held": {"pass": budget["under_budget"] and budget["shards_identical"]}}
    if args.zst_gib > 0:
        stored = int(args.zst_gib * 2**30)
        setting = Setting({"wiki": [], "books": []}, tokenizer, work, args.quiet_wait)
        large = {}
        for name, size in (("quarter", stored // 4), ("full", stored)):
            zst = work / "formats" / f"web-{name}.jsonl.zst"
            info = write_zst(texts, zst, size)
            say(f"{zst.name}: {mib(info['stored_bytes'])} MiB stored, {mib(info['decompressed_bytes'])} MiB of JSON "
                f"lines ({info['copies']} copies)")
            large[name] = large_file_run(setting, zst, info, args.max_memory, name)
            r = large[name]
            say(f"{name}: {r['parts_chosen']} parts, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, largest worker "
                f"peak {mib(r['worker_peak_rss_bytes'])} MiB (of {mib(r['budget_per_process_bytes'])}), "
                f"{r['workers_with_work']} processes with work")
        results["large_zst"] = large
        results.setdefault("checks", {}).update({
            "large_file_worker_under_budget": {"pass": all(r["worker_peak_rss_bytes"] <= r["budget_per_process_bytes"]
                                                            for r in large.values())},
            "large_file_shared_by_both_workers": {"pass": all(r["workers_with_work"] >= 2 for r in large.values())},
        })
        results["large_zst"]["worker_peak_full_over_quarter"] = round(
            large["full"]["worker_peak_rss_bytes"] / large["quarter"]["worker_peak_rss_bytes"], 3)
    elif "large_zst" in previous:
        results["large_zst"] = previous["large_zst"]
    results["source_changed_during_run"] = record.source_digest(MEASURED_CODE) != results["source_sha256"]
    results["all_checks_pass"] = all(c["pass"] for c in results.get("checks", {}).values())
    results["bench_wall_s"] = round(time.perf_counter() - begun, 1)
    record.write_json(out_file, results)
    for name, check in results.get("checks", {}).items():
        say(f"check {name}: {check.get('value', '')} {check.get('target', '')} -> {'pass' if check['pass'] else 'FAIL'}")
    say(f"wrote {out_file}")
    return 0 if results["all_checks_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
