"""ELECTRA (Clark et al., 2020): the generator and discriminator (``model.py``) and their Hugging Face interop
(``hf.py``: a run's export is the discriminator, with the generator in ``generator/``)."""
from models.electra.hf import GENERATOR, load_config, load_discriminator
from models.electra.model import ElectraModel
from models.registry import ModelFamily

FAMILY = ModelFamily(model_type="electra", load_config=load_config, load_encoder=load_discriminator,
                     encoder_class=ElectraModel, pooled=False, export_parts=(GENERATOR,))
