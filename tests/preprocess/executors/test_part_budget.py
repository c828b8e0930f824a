"""The memory budget: --max-memory SIZE chooses the number of parts, and the output does not change."""
from __future__ import annotations

import pytest

from common import sizes
from common.configlib import ConfigError
from common.errors import InputError
from common.preprocess_config import InputSourceConfig, PreprocessConfig
from preprocess.cli import main
from preprocess.executors import local, part_budget
from preprocess.readers import lines
from tests.preprocess.conftest import SAMPLES, read_manifest, run_cli, shard_hashes

MiB = 1 << 20
FILES = [("wiki", "dumps/a.xml.bz2", 40 * MiB), ("wiki", "dumps/b.xml", 60 * MiB),
         *[("book", f"books/{i}.txt", 10 * MiB) for i in range(6)]]


@pytest.mark.parametrize("text, size", [("1.5G", 3 << 29), ("800M", 800 * MiB), ("2GiB", 2 << 30),
                                        ("512mb", 512 * MiB), ("4096", 4096), ("64K", 65536)])
def test_sizes_parse_in_binary_units(text, size):
    assert sizes.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1.5X", "-1G", "G"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match="not a memory size"):
        sizes.parse_size(text)


def test_sizes_print_as_they_parse():
    assert sizes.format_size(3 << 29) == "1.5G" and sizes.parse_size(sizes.format_size(800 * MiB)) == 800 * MiB


def test_the_fewest_parts_that_fit_are_chosen():
    peaks = [part_budget.estimated_peak(FILES, parts) for parts in range(1, len(FILES) + 1)]
    assert peaks[0] > peaks[1] > peaks[2] and min(peaks) > part_budget.BASE_PEAK_BYTES
    for parts, peak in enumerate(peaks[:3], start=1):
        choice = part_budget.choose_parts(FILES, peak)
        assert (choice.parts, choice.estimated_peak) == (parts, peak)
        assert part_budget.choose_parts(FILES, peak - 1).parts > parts
    assert part_budget.choose_parts(FILES, 1 << 40).parts == 1


def test_a_compressed_dump_counts_more_per_stored_byte():
    compressed = part_budget.estimated_peak([("wiki", "a.xml.bz2", 10 * MiB)], 1)
    plain = part_budget.estimated_peak([("wiki", "a.xml", 10 * MiB)], 1)
    assert compressed > plain > part_budget.BASE_PEAK_BYTES


def test_every_readers_memory_class_has_a_slope():
    files = [("wiki", "a.xml.bz2"), ("wiki", "a.xml"), ("book", "b.txt"), ("jsonl:web", "c.jsonl"),
             ("jsonl:web", "c.jsonl.zst"), ("text:notes", "d.txt.gz"), ("parquet:pq", "e.parquet"),
             ("datasets:hf", "d/data-00000-of-00001.arrow")]
    classes = {part_budget.input_kind(key, uri) for key, uri in files}
    assert classes <= part_budget.PEAK_BYTES_PER_INPUT_BYTE.keys() and len(classes) == len(files)
    compressed = part_budget.estimated_peak([("jsonl:web", "c.jsonl.gz", 10 * MiB)], 1)
    assert compressed > part_budget.estimated_peak([("jsonl:web", "c.jsonl", 10 * MiB)], 1)


def test_a_budget_below_one_file_per_part_is_refused_in_one_line():
    smallest = part_budget.estimated_peak(FILES, len(FILES))
    with pytest.raises(InputError, match=r"max-memory .* too small .* at least") as raised:
        part_budget.choose_parts(FILES, smallest - 1)
    assert "\n" not in str(raised.value)


def test_the_local_pool_fits_one_large_compressed_file_into_a_budget_that_whole_files_cannot_meet():
    files = [("jsonl:web", "crawl/web.jsonl.zst", 1 << 30)]  # stride pieces: the pool's two processes share it
    web = InputSourceConfig(name="web", format="jsonl", paths=["crawl"])
    budget = 2 << 30  # per process
    with pytest.raises(InputError, match="even one input file per part"):
        part_budget.choose_parts(files, budget)  # Beam's runners hold a part's files whole
    units_of = local.unit_shares(files, (web,))
    choice = part_budget.choose_parts(files, budget, processes=2, units_of=units_of)
    assert choice.parts > 2 and choice.estimated_peak <= budget
    assert part_budget.pool_peak(files, choice.parts - 1, 2, units_of) > budget
    weight = part_budget.weighted_bytes(*files[0])
    assert part_budget.pool_peak(files, 1, 2, units_of) == part_budget.BASE_PEAK_BYTES + int(weight)
    largest = max(share for _, share in units_of(choice.parts))
    assert largest <= 1 / lines.MAX_STREAM_READS[".zst"] + 1e-9
    assert choice.estimated_peak == int(part_budget.BASE_PEAK_BYTES + weight / choice.parts + weight * largest)
    with pytest.raises(InputError, match="per worker process .* even \\d+ parts need") as raised:
        part_budget.choose_parts(files, part_budget.BASE_PEAK_BYTES + int(weight * largest), 2, units_of)
    assert "\n" not in str(raised.value)


def test_the_choice_says_what_it_chose():
    choice = part_budget.PartsChoice(parts=4, estimated_peak=int(1.3 * (1 << 30)), budget=3 << 29)
    assert choice.describe() == "max-memory 1.5G: 4 parts (estimated peak 1.3G per part)"


def test_the_config_key_is_checked():
    assert PreprocessConfig(max_memory="8G").max_memory == "8G"
    with pytest.raises(ValueError, match="not a memory size"):
        PreprocessConfig(max_memory="eight gigs")


def test_the_cli_option_is_checked_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["run", "--config", "configs/preprocess/tiny.yaml", "--output", "x", "--max-memory", "lots"])
    assert raised.value.code == 2 and "not a memory size" in capsys.readouterr().err
    status = main(["run", "--config", "configs/preprocess/tiny.yaml", "--output", "x", "--tokenizer", "t",
                   "--max-memory", "8G", "--parts", "2"])
    assert status == 2 and "--parts and --max-memory" in capsys.readouterr().err


def test_steps_need_a_fixed_number_of_parts(tmp_path, bert_vocab):
    proc = run_cli("run", "--config", "configs/preprocess/tiny.yaml", "--wikipedia", SAMPLES / "wikipedia",
                   "--tokenizer", bert_vocab, "--output", tmp_path / "out", "--max-memory", "8G", "--part", "0",
                   check=False)
    assert proc.returncode == 2 and "fixed --parts N" in proc.stderr


def test_a_run_under_a_budget_writes_the_same_shards_as_one_part(tmp_path, bert_vocab):
    inputs = ["--wikipedia", SAMPLES / "wikipedia", "--books", SAMPLES / "books"]
    whole = tmp_path / "parts1"
    run_cli("run", "--config", "configs/preprocess/tiny.yaml", *inputs, "--tokenizer", bert_vocab, "--output", whole)
    from preprocess.executors.plan import resolve_inputs

    sized = resolve_inputs([str(SAMPLES / "wikipedia")], [str(SAMPLES / "books")])
    budget = part_budget.estimated_peak(sized, 2)  # two parts fit, one does not
    assert part_budget.choose_parts(sized, budget).parts == 2
    budgeted = tmp_path / "budgeted"
    proc = run_cli("run", "--config", "configs/preprocess/tiny.yaml", *inputs, "--tokenizer", bert_vocab,
                   "--output", budgeted, "--max-memory", str(budget))
    assert f"max-memory {sizes.format_size(budget)}: 2 parts (estimated peak" in proc.stderr
    assert read_manifest(budgeted)["parameters"]["parts"] == 2
    assert shard_hashes(budgeted) == shard_hashes(whole)
    # Beam's notes about optional client libraries it did not find are not shown.
    assert "bson" not in proc.stderr and "apitools" not in proc.stderr


def test_unknown_budget_values_in_a_config_name_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("max_memory: plenty\n")
    from common import preprocess_config as config

    with pytest.raises(ConfigError, match="not a memory size"):
        config.load(path)
