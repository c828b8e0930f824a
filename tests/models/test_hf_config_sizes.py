"""A Hugging Face config.json whose sizes would make an impossibly large model (a damaged or hostile file) is refused
in one line naming the file, before any weight is allocated."""
import json
import resource
import sys
import textwrap

import pytest

from common import processes
from common.errors import CheckpointError
from models.hf_io import MAX_PARAMETERS
from tests.models.test_hf_config_fuzz import BERT, FAMILIES


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "max_position_embeddings", "num_hidden_layers",
                                   "intermediate_size"])
def test_a_size_of_ten_to_the_twelve_is_refused_naming_the_file(family, field, tmp_path):
    document, loader = FAMILIES[family]
    heads = {"num_attention_heads": 1} if field == "hidden_size" else {}
    (tmp_path / "config.json").write_text(json.dumps({**document, **heads, field: 10 ** 12}))
    with pytest.raises(CheckpointError) as refused:
        loader(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: its sizes (") and "\n" not in message
    assert f"{field} 1,000,000,000,000" in message and "refused before allocating" in message


def test_the_largest_real_models_of_the_families_are_within_the_bound(tmp_path):
    large = {**BERT, "vocab_size": 128_100, "hidden_size": 1536, "num_hidden_layers": 48, "num_attention_heads": 24,
             "intermediate_size": 6144, "max_position_embeddings": 512}  # DeBERTa-v2 xxlarge's shapes, as BERT
    (tmp_path / "config.json").write_text(json.dumps(large))
    assert FAMILIES["bert"][1](tmp_path).num_hidden_layers == 48
    assert 4 * 1536 ** 2 * 48 < MAX_PARAMETERS


_BUILD = """
    import sys
    from models.bert.hf import load_pretrained
    try:
        load_pretrained(sys.argv[1])
    except Exception as error:
        print(type(error).__name__, error)
"""


def test_loading_such_a_model_fails_in_one_line_under_a_small_memory_limit(tmp_path):
    """The whole load (config, then the model, then weights), in a process limited to 3 GiB of address space: it
    ends with the config's line, not a MemoryError or the kernel's OOM killer."""
    (tmp_path / "config.json").write_text(json.dumps({**BERT, "vocab_size": 10 ** 12}))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    result = processes.run([sys.executable, "-c", textwrap.dedent(_BUILD), str(tmp_path)], capture_output=True,
                           text=True, timeout=120, preexec_fn=limit)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("CheckpointError ") and "refused before allocating" in result.stdout
