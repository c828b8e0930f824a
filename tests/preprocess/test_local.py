"""The local process pool: when it is used, which options it keeps, and how it shares out the files."""
from preprocess import local


def test_pool_only_for_local_multi_processing():
    assert local.wants_local_pool(["--direct_num_workers", "4", "--direct_running_mode", "multi_processing"]) == 4
    assert local.wants_local_pool(["--direct_num_workers=2", "--direct_running_mode=multi_processing"]) == 2
    assert local.wants_local_pool(["--direct_num_workers", "2"]) == 0  # in-memory mode: Beam's own
    assert local.wants_local_pool(["--direct_num_workers", "1", "--direct_running_mode", "multi_processing"]) == 0
    assert local.wants_local_pool(["--runner", "apache_beam.runners.dask.dask_runner.DaskRunner",
                                   "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]) == 0


def test_in_memory_args_drop_the_worker_options_only():
    args = ["--direct_num_workers", "2", "--direct_running_mode=multi_processing", "--runner", "DirectRunner",
            "--default_sdk_harness_log_level=INFO"]
    assert local.in_memory_args(args) == ["--default_sdk_harness_log_level=INFO"]


def test_large_files_are_shared_by_bucket_and_small_ones_balanced():
    files = [("wiki", "s3://x/enwiki-1.xml.bz2", 1_000_000)] + [("book", f"b{i}.txt", 100_000) for i in range(10)]
    assigned = local.assign_files(files, slices=2, bucket_bits=4)
    # The dump is read by both slices, each keeping its own half of the buckets.
    assert [e for e in assigned[0] if e[0] == "wiki"] == [("wiki", "s3://x/enwiki-1.xml.bz2", (4, 0, 8))]
    assert [e for e in assigned[1] if e[0] == "wiki"] == [("wiki", "s3://x/enwiki-1.xml.bz2", (4, 8, 16))]
    books = [[e for e in s if e[0] == "book"] for s in assigned]
    assert sorted(e[1] for s in books for e in s) == sorted(f"b{i}.txt" for i in range(10))  # each book once
    assert all(e[2] is None for s in books for e in s)
    assert abs(len(books[0]) - len(books[1])) <= 1


def test_many_similar_files_are_never_read_twice():
    files = [("wiki", f"part{i}.xml.bz2", 500_000) for i in range(8)]
    assigned = local.assign_files(files, slices=2, bucket_bits=3)
    uris = [e[1] for s in assigned for e in s]
    assert sorted(uris) == sorted(f"part{i}.xml.bz2" for i in range(8)) and len(assigned[0]) == 4
