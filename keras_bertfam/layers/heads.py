"""Pretraining heads: masked-LM (tied), pair classification (NSP / SOP)."""
import keras
from keras import ops

from keras_bertfam.layers.encoder import get_activation
from keras_bertfam.layers.utils import clone_initializer, serialize_initializer


def gather_positions(sequence, positions):
    """(B, T, H) states at (B, P) int positions -> (B, P, H)."""
    positions = ops.cast(positions, "int32")
    return ops.take_along_axis(sequence, positions[:, :, None], axis=1)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: gather the masked positions, transform, project onto the tied embedding.

    `logits = LN(act(W h[positions])) @ E^T + b`: the transform runs at the embedding width
    (E = H for BERT; ALBERT's and ELECTRA's smaller E) so the output can be tied to the V x E token
    table, which is the table of `token_embedding` (not copied). Gathering first makes the vocabulary
    projection cost P x V instead of T x V.

    Args:
        token_embedding: the backbone's `keras.layers.Embedding` for token ids.
        activation, layer_norm_epsilon, kernel_initializer: of the transform.

    Call args: `sequence` (B, T, H) and `positions` (B, P) -> logits (B, P, V).
    """

    def __init__(
        self,
        token_embedding,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        vocabulary_size, embedding_dim = token_embedding.input_dim, token_embedding.output_dim
        self.dense = keras.layers.Dense(
            embedding_dim,
            activation=get_activation(activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            name="transform",
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm"
        )
        self.vocabulary_size = vocabulary_size

    def build(self, sequence_shape, positions_shape=None):
        self.dense.build(sequence_shape)
        self.layer_norm.build(tuple(sequence_shape[:-1]) + (self.dense.units,))
        self.bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, sequence, positions=None):
        x = sequence if positions is None else gather_positions(sequence, positions)  # (B, P, H)
        x = self.layer_norm(self.dense(x))  # (B, P, E)
        table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (V, E)
        return ops.matmul(x, ops.transpose(table)) + ops.cast(self.bias, x.dtype)  # (B, P, V)

    def compute_output_shape(self, sequence_shape, positions_shape=None):
        length = sequence_shape[1] if positions_shape is None else positions_shape[1]
        return (sequence_shape[0], length, self.vocabulary_size)

    def get_config(self):
        # The tied embedding is a reference into the backbone: the task that owns both rebuilds it.
        raise NotImplementedError("MaskedLMHead is serialized by the task that owns it.")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class PairHead(keras.layers.Layer):
    """Two-way classifier on the pooled [CLS] state: BERT's NSP, ALBERT's SOP.

    Call args: `pooled_output` (B, H) -> logits (B, 2). Label 1 is "random next" for NSP (BERT's
    `is_random_next`) and "swapped" for SOP.
    """

    def __init__(self, num_classes=2, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dense = keras.layers.Dense(
            num_classes, kernel_initializer=clone_initializer(self.kernel_initializer),
            name="logits",
        )

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.built = True

    def call(self, pooled_output):
        return self.dense(pooled_output)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        return config
