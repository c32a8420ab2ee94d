"""Parameter counts from a config, without building the model.

`count_params(backbone_cls, config)` reads the `EncoderBackbone` arguments a family's constructor
passes on (by binding them, not by building any layer) and counts the weights analytically:
embeddings (token, position, segment tables at width E, LayerNorm, E->H projection), each distinct
attention and feed-forward sublayer of the sharing plan, and the pooler. A family whose backbone is
not an `EncoderBackbone` gives its own `FamilySpec.count_params`. `tests/test_presets.py` checks the
count against built models for small configs of every option and every registered preset.
"""
import inspect

from keras_bertfam.layers.encoder import sharing_plan
from keras_bertfam.models.backbone import EncoderBackbone


class _Captured(Exception):
    pass


def encoder_arguments(backbone_cls, config):
    """The full `EncoderBackbone.__init__` arguments `backbone_cls(**config)` would use."""
    if not issubclass(backbone_cls, EncoderBackbone):
        raise TypeError(f"{backbone_cls.__name__} is not an EncoderBackbone.")
    signature = inspect.signature(EncoderBackbone.__init__)
    captured = {}
    original = EncoderBackbone.__init__

    def spy(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        captured.update(bound.arguments)
        raise _Captured

    EncoderBackbone.__init__ = spy
    try:
        backbone_cls(**config)
    except _Captured:
        pass
    finally:
        EncoderBackbone.__init__ = original
    if not captured:
        raise TypeError(f"{backbone_cls.__name__} did not call EncoderBackbone.__init__.")
    captured.pop("self")
    captured.update(captured.pop("kwargs", {}))
    return captured


def encoder_param_count(vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
                        embedding_dim=None, max_sequence_length=512, num_segments=2,
                        position_offset=0, num_groups=None, share="none", pooler=True,
                        num_inner_repetitions=1, **_):
    H, I, E = hidden_dim, intermediate_dim, embedding_dim or hidden_dim
    embeddings = (vocabulary_size + max_sequence_length + position_offset + num_segments) * E
    embeddings += 2 * E  # LayerNorm
    if E != H:
        embeddings += E * H + H  # projection
    attention = 4 * (H * H + H) + 2 * H  # q, k, v, output + LayerNorm
    feedforward = (H * I + I) + (I * H + H) + 2 * H
    attention_ids, ffn_ids = sharing_plan(num_layers, num_groups or num_layers, share)
    encoder = len(set(attention_ids)) * attention + len(set(ffn_ids)) * feedforward
    encoder *= num_inner_repetitions
    return embeddings + encoder + ((H * H + H) if pooler else 0)


def count_params(backbone_cls, config, family=None):
    """Parameters of `backbone_cls(**config)` (shared weights once), without building it."""
    if family is not None and getattr(family, "count_params", None) is not None:
        return family.count_params(config)
    if not issubclass(backbone_cls, EncoderBackbone):
        raise TypeError(f"{backbone_cls.__name__} is not an EncoderBackbone: its FamilySpec "
                        "needs a count_params(config).")
    return encoder_param_count(**encoder_arguments(backbone_cls, config))
