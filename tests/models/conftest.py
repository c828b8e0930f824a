"""The model families' tests use the pretraining tests' synthetic datasets (rows of the real format)."""
from tests.pretrain.conftest import synthetic_dataset  # noqa: F401
