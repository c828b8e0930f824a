"""DeBERTa-v3 (He et al., 2021): the encoder with disentangled attention and its heads (``model.py``), the
generator/discriminator pair with gradient-disentangled embedding sharing (``pair.py``) and their Hugging Face interop
(``hf.py``: a run's export is the discriminator, with the generator in ``generator/``)."""
from models.deberta_v2.hf import GENERATOR, load_config, load_encoder
from models.deberta_v2.model import DebertaV2Model
from models.registry import ModelFamily

FAMILY = ModelFamily(model_type="deberta-v2", load_config=load_config, load_encoder=load_encoder,
                     encoder_class=DebertaV2Model, pooled=False, export_parts=(GENERATOR,), context_pooler=True,
                     encoder_prefix="deberta")
