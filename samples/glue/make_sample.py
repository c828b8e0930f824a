"""Writes the bundled GLUE-format sample (SST-2 and RTE layouts) from templates; run once, output committed.

The sentences are written for this project, about the invented province of the sample corpus. They follow
the official GLUE TSV layout exactly (header row, tab-separated, no quoting), so the demo exercises the
same reader as the real data. Deterministic: the same seed gives the same files.
"""
import pathlib
import random

HERE = pathlib.Path(__file__).resolve().parent
SUBJECTS = ["the orchard tour", "the harbour festival", "the lamplighter's story", "the new ferry", "the museum in Eastmark",
            "the winter market", "the old mill bakery", "the choir concert", "the coastal path", "the village library",
            "the apple harvest fair", "the night train to the capital", "the puppet theatre", "the lighthouse visit",
            "the fishing cooperative's supper", "the river cruise", "the book on frost heave", "the guided hike"]
POSITIVE = ["was a delight from start to finish", "left everyone smiling", "is warm, clever and generous",
            "was worth every minute", "felt wonderful and well made", "charmed the whole family",
            "is the best thing we did all year", "was bright, friendly and beautifully run"]
NEGATIVE = ["was a tedious waste of an afternoon", "left everyone cold and bored", "is dull, muddled and overlong",
            "was not worth the ticket", "felt cheap and badly organised", "disappointed the whole family",
            "is the worst thing we did all year", "was grey, rude and poorly run"]
PEOPLE = ["Mara", "the lamplighter", "the ferryman", "Tobias", "the schoolteacher", "Ilse", "the harbour master",
          "old Wendel", "the baker", "Greta"]
PLACES = ["the harbour", "the orchard", "the mill", "the library", "the lighthouse", "the market square",
          "the station", "the chapel"]
TIMES = ["at dawn", "before supper", "on Sunday", "after the storm", "in the spring", "late at night"]


def sst2(rng: random.Random, subjects: list[str]) -> list[str]:
    """Every subject with every verdict, shuffled; train and dev get different subjects, so dev is unseen text."""
    pairs = [(subject, verdict, label) for subject in subjects
             for label, verdicts in ((1, POSITIVE), (0, NEGATIVE)) for verdict in verdicts]
    rng.shuffle(pairs)
    # SST-2 sentences end in a space before the tab, as in GLUE.
    return ["sentence\tlabel"] + [f"{subject} {verdict} \t{label}" for subject, verdict, label in pairs]


def rte(rng: random.Random, count: int) -> list[str]:
    rows = ["index\tsentence1\tsentence2\tlabel"]
    for index in range(count):
        person, place, time = rng.choice(PEOPLE), rng.choice(PLACES), rng.choice(TIMES)
        premise = f"{person[0].upper() + person[1:]} walked to {place} {time} and waited there for an hour."
        kind = rng.randrange(3)
        if kind == 0:
            hypothesis, label = f"{person[0].upper() + person[1:]} went to {place}.", "entailment"
        elif kind == 1:
            other = rng.choice([p for p in PLACES if p != place])
            hypothesis, label = f"{person[0].upper() + person[1:]} went to {other}.", "not_entailment"
        else:
            hypothesis, label = f"{person[0].upper() + person[1:]} never left home.", "not_entailment"
        rows.append(f"{index}\t{premise}\t{hypothesis}\t{label}")
    return rows


def main() -> None:
    rng = random.Random(20261122)
    splits = {("SST-2", "train"): sst2(rng, SUBJECTS[:14]), ("SST-2", "dev"): sst2(rng, SUBJECTS[14:]),
              ("RTE", "train"): rte(rng, 300), ("RTE", "dev"): rte(rng, 90)}
    for (task, split), rows in splits.items():
        (HERE / task).mkdir(exist_ok=True)
        (HERE / task / f"{split}.tsv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
