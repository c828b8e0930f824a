"""bench.preprocess.calibrate: the fit of the --max-memory estimate to measured peaks."""
import json

from bench import record
from bench.preprocess import calibrate as preprocess_calibrate
from preprocess.executors import part_budget

MIB = 1 << 20


def _run(label: str, files: list[tuple[str, str, int]], parts: int, peak: int) -> dict:
    return {"label": label, "parts": parts, "files": files,
            "weighted_input": preprocess_calibrate.weighted_input(files), "peak_tree_rss_bytes": peak}


def test_the_fit_recovers_the_slopes_and_covers_every_run_with_its_base():
    slopes = {"wiki_compressed": 10.0, "book": 7.0}
    base = 200 * MIB
    wiki = [("wiki", f"d{i}.xml.bz2", 4 * MIB) for i in range(4)]
    books = [("book", f"b{i}.txt", 10 * MIB) for i in range(4)]
    runs = [_run(name, files, 1, part_budget.estimated_peak(files, 1, slopes, base))
            for name, files in (("wiki", wiki[:1]), ("wiki4", wiki), ("books", books[:1]), ("books4", books),
                                ("all", wiki + books))]
    # A split run that needs 25 MiB more than the model says: the base must grow to cover it, the slopes not.
    split = wiki + books
    runs.append(_run("all_parts_4", split, 4, part_budget.estimated_peak(split, 4, slopes, base) + 25 * MIB))

    fitted = preprocess_calibrate.fit(runs)

    assert fitted["peak_bytes_per_input_byte"] == slopes
    assert fitted["base_bytes"] == 230 * MIB   # 225 MiB needed, rounded up to 10 MiB
    assert all(part_budget.estimated_peak(r["files"], r["parts"], fitted["peak_bytes_per_input_byte"],
                                     fitted["base_bytes"]) >= r["peak_tree_rss_bytes"] for r in runs)


def test_the_runs_cover_each_kind_at_each_size_and_the_split_input():
    labels = [label for label, *_ in preprocess_calibrate.runs_to_make([1, 8])]
    assert labels == ["wiki_1x_parts_1", "wiki_8x_parts_1", "books_1x_parts_1", "books_8x_parts_1",
                      "all_8x_parts_1", "all_8x_parts_4", "all_8x_parts_16"]
    labels = [label for label, *_ in preprocess_calibrate.runs_to_make([1, 8, 32])]
    assert labels[-5:] == ["all_32x_parts_1", "all_8x_parts_4", "all_8x_parts_16", "all_32x_parts_4",
                           "all_32x_parts_16"]


def test_slopes_between_steps_are_rounded_up_and_the_estimate_still_covers_every_run():
    wiki = [("wiki", f"d{i}.xml.bz2", 4 * MIB) for i in range(4)]
    books = [("book", f"b{i}.txt", 10 * MIB) for i in range(4)]
    slopes = {"wiki_compressed": 10.2, "book": 6.6}
    runs = [_run(name, files, 1, part_budget.estimated_peak(files, 1, slopes, 180 * MIB))
            for name, files in (("wiki", wiki[:1]), ("wiki4", wiki), ("books", books[:1]), ("all", wiki + books))]

    fitted = preprocess_calibrate.fit(runs)

    assert fitted["peak_bytes_per_input_byte"] == {"wiki_compressed": 10.5, "book": 7.0}
    assert fitted["least_squares"]["peak_bytes_per_input_byte"] == slopes
    assert fitted["base_bytes"] % (10 * MIB) == 0
    assert min(fitted["fitted_estimate_over_peak"].values()) >= 1


def test_the_estimate_in_use_is_the_recorded_fit():
    recorded = [json.loads(path.read_text())["memory_calibration"]
                for path in sorted(record.RESULTS.glob("preprocess-*.json"))
                if "memory_calibration" in json.loads(path.read_text())]
    assert recorded, "no memory_calibration in bench/results: run python -m bench.preprocess.calibrate"
    fit = recorded[0]["fit"]
    # At or above the fit, never below: the base in use keeps 10 MiB for the spread of a peak between runs.
    assert fit["base_bytes"] <= part_budget.BASE_PEAK_BYTES <= fit["base_bytes"] + (10 << 20)
    assert {kind: part_budget.PEAK_BYTES_PER_INPUT_BYTE[kind] for kind in fit["peak_bytes_per_input_byte"]} == \
        fit["peak_bytes_per_input_byte"]
    assert min(fit["fitted_estimate_over_peak"].values()) >= 1
