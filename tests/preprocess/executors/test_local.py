"""The local process pool: how it shares out the files."""
from preprocess.executors import local


def test_a_large_dump_is_split_into_byte_ranges_and_units_come_largest_first():
    size = 3_000_000
    files = [("wiki", "s3://x/enwiki-1.xml.bz2", size)] + [("book", f"b{i}.txt", 400_000) for i in range(10)]
    units = local.plan_units(files, slices=2, bucket_bits=4)
    ranges = sorted(e[2] for _, e in units if e[0] == "wiki")
    # Contiguous byte ranges that cover the dump once, several per slice so that they balance.
    assert ranges[0][1] == 0 and ranges[-1][2] == size and len(ranges) >= 4
    assert all(a[2] == b[1] for a, b in zip(ranges, ranges[1:])) and {r[0] for r in ranges} == {"bytes"}
    assert sorted(e[1] for _, e in units if e[0] == "book") == sorted(f"b{i}.txt" for i in range(10))  # once each
    assert all(e[2] is None for _, e in units if e[0] == "book")
    costs = [cost for cost, _ in units]
    assert costs == sorted(costs, reverse=True)
    assert abs(sum(costs) - sum(local.estimated_cost(*f) for f in files)) < 1e-6 * sum(costs)


def test_units_follow_the_pieces_and_shares_the_reader_gives():
    files = [("wiki", "enwiki.xml.bz2", 2_000_000), ("book", "b.txt", 10_000)]
    snapped = [(0.35, ("bytes", 0, 700_000)), (0.65, ("bytes", 700_000, 2_000_000))]
    units = local.plan_units(files, slices=2, bucket_bits=4,
                             pieces=lambda key, uri, size, count: snapped if key == "wiki" else [])
    assert sorted(e[2] for _, e in units if e[0] == "wiki") == [("bytes", 0, 700_000), ("bytes", 700_000, 2_000_000)]
    wiki_costs = sorted(c for c, e in units if e[0] == "wiki")
    assert abs(wiki_costs[1] / wiki_costs[0] - 1_300_000 / 700_000) < 1e-9  # costed by their shares


def test_large_files_that_cannot_be_cut_into_ranges_are_shared_by_bucket():
    books = [("book", f"b{i}.txt", 10_000) for i in range(10)]
    halves = [("buckets", 4, 0, 8), ("buckets", 4, 8, 16)]
    # A gzip dump has no independent blocks: it is read twice, each read keeping its own half of the buckets.
    units = local.plan_units([("wiki", "enwiki-1.xml.gz", 1_000_000)] + books, slices=2, bucket_bits=4)
    assert sorted(e[2] for _, e in units if e[0] == "wiki") == halves
    # A .bz2 dump of about one block: the same.
    units = local.plan_units([("wiki", "small.xml.bz2", 200_000)] + books, slices=2, bucket_bits=4)
    assert sorted(e[2] for _, e in units if e[0] == "wiki") == halves


def test_many_similar_files_are_never_read_twice():
    files = [("wiki", f"part{i}.xml.bz2", 500_000) for i in range(8)]
    units = local.plan_units(files, slices=2, bucket_bits=3)
    assert sorted(e[1] for _, e in units) == sorted(f"part{i}.xml.bz2" for i in range(8))
    assert all(e[2] is None for _, e in units)
