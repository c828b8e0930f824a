"""A Hugging Face directory given to finetune (finetune.pretrained): its config.json and tokenizer_config.json,
mutated or damaged, give the model's config and tokenizer or one CheckpointError/InputError line; and remote-code
keys (``auto_map``) never make anything run: the files are read as JSON, never imported."""
import ast
import json
import pathlib
import runpy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CheckpointError, InputError
from finetune import pretrained
from models.bert.hf import export
from models.bert.model import BertConfig, BertForPreTraining
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"word{i}" for i in range(25)]
TINY = BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=16, max_position_embeddings=16)
# Importing either module would leave a marker file beside it: the proof that it ran.
REMOTE_CODE = ("import pathlib\n"
               "pathlib.Path(__file__).with_name('REMOTE_CODE_RAN').write_text('imported')\n"
               "class EvilConfig: pass\nclass EvilModel: pass\n")
AUTO_MAP = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
            "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}


@pytest.fixture(scope="module")
def remote_code_model(tmp_path_factory) -> pathlib.Path:
    """A tiny BERT export whose config.json and tokenizer_config.json name remote code that would leave a marker."""
    directory = tmp_path_factory.mktemp("hub") / "model"
    export(BertForPreTraining(TINY), directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(auto_map=AUTO_MAP, trust_remote_code=True, architectures=["EvilModel"])
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "auto_map": AUTO_MAP,
                                                                 "tokenizer_class": "EvilTokenizer"}))
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    for module in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py", "__init__.py"):
        (directory / module).write_text(REMOTE_CODE)
    return directory


def test_auto_map_in_config_json_is_loaded_without_running_its_code(remote_code_model, tmp_path):
    model_dir = pretrained.resolve(remote_code_model, tmp_path)
    assert pretrained.model_type(model_dir) == "bert"
    assert pretrained.load_model_config(model_dir) == TINY
    encoder = pretrained.load_encoder(model_dir)
    tokenizer = pretrained.load_tokenizer_for(model_dir)
    assert encoder.config.vocab_size == tokenizer.vocab_size == len(VOCAB)
    assert not (remote_code_model / "REMOTE_CODE_RAN").exists(), "a module named by auto_map was imported"
    # The marker proves something: running the module does leave it.
    runpy.run_path(str(remote_code_model / "modeling_evil.py"))
    assert (remote_code_model / "REMOTE_CODE_RAN").exists()
    (remote_code_model / "REMOTE_CODE_RAN").unlink()


def _remote_code_lines(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` that pass ``trust_remote_code`` anything but a literal False, as a keyword argument or as
    a key of a dict literal (``**options``)."""
    def trusted(name, value) -> bool:
        return name == "trust_remote_code" and not (isinstance(value, ast.Constant) and value.value is False)

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and any(trusted(keyword.arg, keyword.value) for keyword in node.keywords):
            lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(isinstance(key, ast.Constant) and trusted(key.value, value)
                                              for key, value in zip(node.keys, node.values)):
            lines.append(node.lineno)
    return lines


def test_no_code_of_ours_passes_trust_remote_code():
    sources = [path for package in ("common", "preprocess", "pretrain", "finetune", "cluster")
               for path in sorted((ROOT / package).rglob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sources for line in _remote_code_lines(path)]
    assert len(sources) > 50 and found == []


def test_the_remote_code_scan_finds_what_it_looks_for(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("AutoModel.from_pretrained(path, trust_remote_code=True)\n"
                       "AutoModel.from_pretrained(path, trust_remote_code=False)\n"
                       "options = {'trust_remote_code': flag}\n")
    assert _remote_code_lines(planted) == [1, 3]


def test_mutated_hugging_face_files_give_a_config_and_tokenizer_or_one_line(tmp_path):
    config = {"model_type": "bert", **TINY.__dict__, "auto_map": AUTO_MAP}
    settings_file = {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 16}
    config_bytes, settings_bytes = json.dumps(config).encode(), json.dumps(settings_file).encode()
    encoded = lambda document: json.dumps(document).encode()  # noqa: E731
    files = st.one_of(st.tuples(mutated(config).map(encoded), st.just(settings_bytes)),
                      st.tuples(st.just(config_bytes), mutated(settings_file).map(encoded)),
                      st.tuples(damaged_bytes(config_bytes), st.just(settings_bytes)),
                      st.tuples(st.just(config_bytes), damaged_bytes(settings_bytes)))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")

    @settings(FUZZ, max_examples=150)
    @given(files)
    def check(contents):
        (tmp_path / "config.json").write_bytes(contents[0])
        (tmp_path / "tokenizer_config.json").write_bytes(contents[1])
        try:
            pretrained.model_type(tmp_path)
            pretrained.load_model_config(tmp_path)
            pretrained.load_tokenizer_for(tmp_path)
        except (CheckpointError, InputError) as error:
            assert "\n" not in str(error), repr(error)
        assert listing(tmp_path) == ["config.json", "tokenizer_config.json", "vocab.txt"]

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

def _directory(tmp_path, config: dict, settings_text: str | None = None) -> pathlib.Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    if settings_text is not None:
        (tmp_path / "tokenizer_config.json").write_text(settings_text)
    return tmp_path


def test_a_tokenizer_config_that_is_not_a_json_object_is_refused_naming_the_file(tmp_path):
    directory = _directory(tmp_path, {"model_type": "bert", **TINY.__dict__}, "null")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: a JSON NoneType, not an object"):
        pretrained.load_tokenizer_for(directory)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": tru')
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not valid JSON"):
        pretrained.load_tokenizer_for(directory)


def test_a_vocab_size_of_the_wrong_type_is_refused_before_comparing_with_the_tokenizer(tmp_path):
    directory = _directory(tmp_path, {"model_type": "bert", **TINY.__dict__, "vocab_size": {"x": 30}})
    with pytest.raises(CheckpointError, match=r"config\.json: vocab_size: expected an integer"):
        pretrained.load_tokenizer_for(directory)


def test_a_config_json_nested_thousands_deep_is_refused_not_a_recursion_error(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100_000)
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        pretrained.model_type(tmp_path)
