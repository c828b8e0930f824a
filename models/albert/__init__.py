"""ALBERT (Lan et al., 2020): the model (``model.py``) and its Hugging Face interop (``hf.py``)."""
from models.albert.hf import load_albert, load_albert_config
from models.albert.model import AlbertModel
from models.registry import ModelFamily

FAMILY = ModelFamily(model_type="albert", load_config=load_albert_config,
                     load_encoder=lambda directory: load_albert(directory)[0].albert,
                     encoder_class=AlbertModel, pooled=True)
