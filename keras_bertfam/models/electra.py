"""ELECTRA (Clark et al. 2020): the BERT encoder with a factorized embedding width, no pooler."""
import keras

from keras_bertfam.models.backbone import EncoderBackbone


@keras.saving.register_keras_serializable(package="keras_bertfam")
class ElectraBackbone(EncoderBackbone):
    """ELECTRA's encoder (HF `ElectraModel`): embeddings at width `embedding_dim` (E), a Dense
    E -> H projection when E != H (`embeddings_project`), post-LN blocks, no pooler.
    `activation` is HF's exact "gelu" by default; keras-hub's ELECTRA uses "gelu_approximate".

    The positional order is keras-hub's (`hidden_dim`, `embedding_dim`, `intermediate_dim`);
    the arguments after `dtype` are keyword-only.

    Both the discriminator and the generator of ELECTRA pretraining are `ElectraBackbone`s; after
    pretraining the discriminator is the model to fine-tune.

    Example:
    >>> backbone = ElectraBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                            embedding_dim=8, intermediate_dim=32, max_sequence_length=8)
    >>> out = backbone({"token_ids": [[2, 5, 3]], "segment_ids": [[0, 0, 0]],
    ...                 "padding_mask": [[1, 1, 1]]})
    >>> tuple(out["sequence_output"].shape), "pooled_output" in out
    ((1, 3, 16), False)
    """

    family = "electra"
    # HF ElectraForSequenceClassification: classifier.dense -> exact GELU (the ELECTRA authors'
    # fine-tuning head; BERT's is tanh) -> dropout -> classifier.out_proj.
    classifier_hidden_activation = "gelu"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        embedding_dim=None,
        intermediate_dim=None,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        dtype=None,
        *,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        if intermediate_dim is None:
            raise ValueError(
                "ElectraBackbone needs intermediate_dim (keras-hub's positional order: "
                "vocabulary_size, num_layers, num_heads, hidden_dim, embedding_dim, "
                "intermediate_dim)."
            )
        super().__init__(
            vocabulary_size,
            num_layers,
            num_heads,
            hidden_dim,
            intermediate_dim,
            embedding_dim=embedding_dim or hidden_dim,
            dropout=dropout,
            max_sequence_length=max_sequence_length,
            num_segments=num_segments,
            pooler=False,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
            **kwargs,
        )
