"""BERT (Devlin et al., 2019): the model (``model.py``) and its Hugging Face interop (``hf.py``)."""
from models.bert.hf import load_config, load_pretrained
from models.bert.model import BertModel
from models.registry import ModelFamily

FAMILY = ModelFamily(model_type="bert", load_config=load_config,
                     load_encoder=lambda directory: load_pretrained(directory)[0].bert,
                     encoder_class=BertModel, pooled=True)
