"""The strict YAML loader: hostile input is refused quickly, in one line, never expanded into a message."""
import dataclasses
import pathlib
import resource
import subprocess
import sys
import textwrap

import pytest

from common import configlib, processes
from common.configlib import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]

# "Billion laughs": nine levels of nine aliases each are 9**9 (387 million) strings once expanded.
_LEVELS = "abcdefghi"
BILLION_LAUGHS = "name:\n  - &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"  - &{level} [" + ", ".join([f"*{previous}"] * 9) + "]\n" for previous, level in zip(_LEVELS, _LEVELS[1:]))


def _run_bounded(code: str, seconds: float = 30) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python limited to 1 GiB and ``seconds``: a regression that expands the document
    fails here instead of hanging (or swapping) the suite."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    try:
        return processes.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                             timeout=seconds, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {seconds} s: the aliases were expanded")


_LOADER = """
    import dataclasses, sys, time
    from common import configlib

    @dataclasses.dataclass
    class Config:
        name: str = ""

    started = time.perf_counter()
    try:
        {call}
    except configlib.ConfigError as error:
        print(f"{{time.perf_counter() - started:.3f}}", error, sep="\\n")
"""


def test_a_billion_laughs_config_is_refused_at_once_naming_the_file_and_line(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    done = _run_bounded(_LOADER.format(call=f"configlib.load(Config, {str(bomb)!r})"))
    assert done.returncode == 0, done.stderr
    _, message = done.stdout.strip().split("\n")  # bounded by _run_bounded's memory and time; not timed here
    assert message == (f"{bomb}, line 3: YAML aliases (*name) are not allowed in configs; write the value out in "
                       "full")


@dataclasses.dataclass
class _Seeded:
    seed: list | None = None


def test_an_alias_in_an_override_is_refused():
    with pytest.raises(ConfigError, match=r"^--set seed, line 1: YAML aliases \(\*name\) are not allowed"):
        configlib.apply_overrides({}, ["seed=[&a 1, *a]"], _Seeded)


def test_a_huge_value_is_shown_shortened_in_the_message():
    """Defence in depth, past the loader: a shared-reference value that would expand to 9**9 items (as built by
    code, not YAML) is named in a short line."""
    done = _run_bounded(_LOADER.format(call=(
        "value = ['lol'] * 9\n"
        "        for _ in range(8): value = [value] * 9\n"
        "        configlib.from_dict(Config, {'name': value}, 'huge.yaml')")))
    assert done.returncode == 0, done.stderr
    _, message = done.stdout.strip().split("\n")  # bounded by _run_bounded's memory and time; not timed here
    assert message.startswith("huge.yaml: name: expected a string, got [[[") and len(message) < 250


@dataclasses.dataclass
class _Optimizer:
    betas: tuple[float, float] = (0.9, 0.999)
    seeds: tuple[int, ...] = (1,)


@pytest.mark.parametrize("betas, count", [("[0.9]", 1), ("[0.9, 0.98, 0.99]", 3), ("[]", 0)])
def test_a_fixed_length_tuple_of_the_wrong_length_is_refused_in_one_line(tmp_path, betas, count):
    path = tmp_path / "optimizer.yaml"
    path.write_text(f"betas: {betas}\n")
    with pytest.raises(ConfigError) as error:
        configlib.load(_Optimizer, path)
    assert str(error.value).startswith(f"{path}: betas: expected a list of 2 values, got {count}")
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"betas: expected a list of 2 values, got 1"):
        configlib.load(_Optimizer, None, ["betas=[0.9]"])


def test_tuples_of_the_right_length_and_open_ended_ones_load():
    loaded = configlib.from_dict(_Optimizer, {"betas": [0.8, 1], "seeds": [1, 2, 3]}, "x.yaml")
    assert loaded.betas == (0.8, 1.0) and loaded.seeds == (1, 2, 3)
