"""Pretraining heads: masked-LM (tied), pair classification (NSP / SOP), replaced-token detection
(ELECTRA), span boundary objective (SpanBERT)."""
import keras
from keras import ops

from keras_bertfam.layers.encoder import get_activation
from keras_bertfam.layers.normalization import LayerNormalization
from keras_bertfam.layers.utils import (
    clone_initializer,
    gather_positions,
    serialize_initializer,
    sublayer_kwargs,
)


def tied_logits(x, table):
    """`ops.matmul(x, ops.transpose(table))`: (..., E) states against a (V, E) embedding table ->
    (..., V) logits, the same numbers.

    On TensorFlow the gradient is written out: autodiff computes the table's gradient as
    `x^T @ g` in the transposed (E, V) layout and then transposes it, two tensors of the table's
    size (89 MB each at BERT-base's 30,522 x 768) alive at once, at the start of the backward
    pass, when the step holds the most. Here it is `g^T @ x`, (V, E) directly (TensorFlow folds
    the transpose into the matmul). Torch's transposes are views and XLA fuses them: there it is
    plain autodiff.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.matmul(x, ops.transpose(table))

    @ops.custom_gradient
    def project(x, table):
        # stop_gradient: an eager tape would otherwise record the forward matmul too.
        logits = ops.matmul(ops.stop_gradient(x), ops.transpose(ops.stop_gradient(table)))

        def grad(upstream):
            d_x = ops.matmul(upstream, table)  # (..., V) @ (V, E)
            rows = ops.reshape(upstream, (-1, ops.shape(upstream)[-1]))  # (N, V)
            d_table = ops.matmul(ops.transpose(rows), ops.reshape(x, (-1, ops.shape(x)[-1])))
            return d_x, d_table  # (..., E), (V, E)

        return logits, grad

    return project(x, table)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MaskedLMHead(keras.layers.Layer):
    """The masked-LM head, with keras-hub's `MaskedLMHead` arguments and behaviour.

    Gather the states at `mask_positions`, transform (`LN(intermediate_activation(W h))`, at the
    embedding width), project onto the vocabulary, add a bias, apply `activation`:
    `activation(LN(act(W h[positions])) @ E^T + b)`. With `token_embedding` the projection is tied
    to its V x E table (the table itself, not a copy), so the transform runs at E (= H for BERT;
    ALBERT's and ELECTRA's smaller E); without it the head owns an (H, V) output kernel. Gathering
    first makes the vocabulary projection cost P x V instead of T x V.

    Args:
        vocabulary_size: V; may be omitted when `token_embedding` is given (must then match it).
        token_embedding: a `keras.layers.Embedding` (e.g. `backbone.token_embedding`) to tie to.
        intermediate_activation: of the transform Dense (keras-hub's default "relu"; BERT's
            heads use "gelu", see `kb.tasks.masked_lm_head`).
        activation: of the output, e.g. "softmax" for probabilities; None returns logits.
        layer_norm_epsilon, kernel_initializer, bias_initializer: as in keras-hub.

    Call args: `inputs` (B, T, H) and `mask_positions` (B, P) int -> (B, P, V). With
    `mask_positions=None` every position is predicted: (B, T, V).

    Example:
    >>> token_embedding = keras.layers.Embedding(100, 16)
    >>> hidden_states = token_embedding(np.random.randint(100, size=(2, 10)))
    >>> head = MaskedLMHead(vocabulary_size=100, token_embedding=token_embedding,
    ...                     activation="softmax")
    >>> preds = head(hidden_states, np.array([[1, 4], [0, 9]]))
    >>> tuple(preds.shape)
    (2, 2, 100)
    """

    def __init__(
        self,
        vocabulary_size=None,
        token_embedding=None,
        intermediate_activation="relu",
        activation=None,
        layer_norm_epsilon=1e-05,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if vocabulary_size is None and token_embedding is None:
            raise ValueError(
                "MaskedLMHead needs `vocabulary_size` or `token_embedding`; got neither."
            )
        if token_embedding is not None:
            if not hasattr(token_embedding, "input_dim") or not hasattr(token_embedding,
                                                                         "output_dim"):
                raise ValueError(
                    f"token_embedding must be a keras.layers.Embedding, got {token_embedding!r}."
                )
            if vocabulary_size is not None and vocabulary_size != token_embedding.input_dim:
                raise ValueError(
                    f"vocabulary_size={vocabulary_size} does not match the "
                    f"token_embedding's input_dim={token_embedding.input_dim}."
                )
            vocabulary_size = token_embedding.input_dim
        self.vocabulary_size = vocabulary_size
        self.token_embedding = token_embedding
        self.intermediate_activation = intermediate_activation
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self._output_activation = keras.activations.get(activation)
        self.dense = None
        self.layer_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm", **sublayer_kwargs(self)
        )

    def build(self, inputs_shape, mask_positions_shape=None):
        width = (self.token_embedding.output_dim if self.token_embedding is not None
                 else inputs_shape[-1])
        self.dense = keras.layers.Dense(
            width,
            activation=get_activation(self.intermediate_activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            name="transform",
            **sublayer_kwargs(self),
        )
        self.dense.build((None, None, inputs_shape[-1]))
        self.layer_norm.build((None, None, width))
        if self.token_embedding is None:
            self.kernel = self.add_weight(
                name="output_kernel", shape=(width, self.vocabulary_size),
                initializer=clone_initializer(self.kernel_initializer),
            )
        self.bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,),
            initializer=clone_initializer(self.bias_initializer),
        )
        self.built = True

    def call(self, inputs, mask_positions=None):
        x = inputs if mask_positions is None else gather_positions(inputs, mask_positions)
        x = self.layer_norm(self.dense(x))  # (B, P, E)
        if self.token_embedding is not None:
            table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (V, E)
            logits = tied_logits(x, table) + ops.cast(self.bias, x.dtype)
        else:
            table = self.kernel  # (E, V)
            logits = ops.matmul(x, ops.cast(table, x.dtype)) + ops.cast(self.bias, x.dtype)
        if self._output_activation is not None:
            logits = self._output_activation(logits)
        return logits  # (B, P, V)

    def compute_output_shape(self, inputs_shape, mask_positions_shape=None):
        length = inputs_shape[1] if mask_positions_shape is None else mask_positions_shape[1]
        return (inputs_shape[0], length, self.vocabulary_size)

    def get_config(self):
        if self.token_embedding is not None:
            # The tied embedding is a reference into the backbone: the task that owns both
            # rebuilds it.
            raise NotImplementedError(
                "A MaskedLMHead tied to a token_embedding is serialized by the task that owns it."
            )
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            intermediate_activation=self.intermediate_activation,
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
            bias_initializer=serialize_initializer(self.bias_initializer),
        )
        return config


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


@keras.saving.register_keras_serializable(package="keras_bertfam")
class ReplacedTokenHead(keras.layers.Layer):
    """ELECTRA's discriminator head: `Dense(H, act) -> Dense(1)`, one logit per token.

    Call args: `sequence` (B, T, H) -> logits (B, T) of "this token was replaced".
    """

    def __init__(self, activation="gelu", kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.activation = activation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dense = None
        self.logit = keras.layers.Dense(
            1, kernel_initializer=clone_initializer(self.kernel_initializer), name="logit"
        )

    def build(self, sequence_shape):
        self.dense = keras.layers.Dense(
            sequence_shape[-1],
            activation=get_activation(self.activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            name="transform",
        )
        self.dense.build(sequence_shape)
        self.logit.build(sequence_shape)
        self.built = True

    def call(self, sequence):
        return ops.squeeze(self.logit(self.dense(sequence)), axis=-1)  # (B, T)

    def compute_output_shape(self, sequence_shape):
        return tuple(sequence_shape[:-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            activation=self.activation,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        return config


def span_boundary_weights(span_starts, span_ends, padding_mask):
    """1.0 for prediction slots whose span has both boundary tokens inside the sequence.

    span_starts, span_ends (B, P): first and last token index of the slot's span; padding_mask
    (B, T). A span touching the sequence edge (s == 0 or e == length - 1) gets no SBO target.
    """
    length = ops.sum(ops.cast(padding_mask, "int32"), axis=1, keepdims=True)  # (B, 1)
    starts = ops.cast(span_starts, "int32")
    ends = ops.cast(span_ends, "int32")
    valid = ops.logical_and(starts >= 1, ends + 1 < length)
    return ops.cast(ops.logical_and(valid, ends >= starts), "float32")  # (B, P)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanBoundaryHead(keras.layers.Layer):
    """SpanBERT's span boundary objective (SBO) head (Joshi et al. 2020, section 3.2).

    For a token at position i inside a masked span s..e it predicts the token from the span's
    outside boundary states and its place in the span only:
    `y = LN(act(W2 LN(act(W1 [h[s-1]; h[e+1]; P[i-s]]))))`, logits `y @ E^T + b` against the tied
    token table (E = H for SpanBERT). `P` is a learned relative-position table of
    `max_span_length` rows x `position_embedding_dim` (200) columns; offsets past the table are
    clipped to its last row. Slots whose boundaries fall outside the sequence must be weighted out
    by the caller (`span_boundary_weights`); their gathers are clipped to stay in range.

    Call args: `sequence` (B, T, H), `positions` (B, P) of the predicted tokens, `span_starts`,
    `span_ends` (B, P) first and last token of each slot's span -> logits (B, P, V).
    """

    def __init__(
        self,
        token_embedding,
        max_span_length=20,
        position_embedding_dim=200,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.max_span_length = max_span_length
        self.position_embedding_dim = position_embedding_dim
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.vocabulary_size = token_embedding.input_dim
        init = lambda: clone_initializer(self.kernel_initializer)
        self.position_embedding = keras.layers.Embedding(
            max_span_length, position_embedding_dim, embeddings_initializer=init(),
            name="relative_position_embedding",
        )
        self.dense_1 = None
        self.layer_norm_1 = LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm_1")
        self.dense_2 = keras.layers.Dense(
            token_embedding.output_dim, activation=get_activation(activation),
            kernel_initializer=init(), name="dense_2",
        )
        self.layer_norm_2 = LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm_2")

    def build(self, sequence_shape, positions_shape=None, span_starts_shape=None,
              span_ends_shape=None):
        hidden = sequence_shape[-1]
        self.dense_1 = keras.layers.Dense(
            hidden, activation=get_activation(self.activation),
            kernel_initializer=clone_initializer(self.kernel_initializer), name="dense_1",
        )
        self.position_embedding.build((None,))
        self.dense_1.build((None, None, 2 * hidden + self.position_embedding_dim))
        self.layer_norm_1.build((None, None, hidden))
        self.dense_2.build((None, None, hidden))
        self.layer_norm_2.build((None, None, self.token_embedding.output_dim))
        self.bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, sequence, positions, span_starts, span_ends):
        last = ops.shape(sequence)[1] - 1
        starts = ops.cast(span_starts, "int32")
        ends = ops.cast(span_ends, "int32")
        left = gather_positions(sequence, ops.clip(starts - 1, 0, last))  # (B, P, H)
        right = gather_positions(sequence, ops.clip(ends + 1, 0, last))  # (B, P, H)
        offset = ops.clip(ops.cast(positions, "int32") - starts, 0, self.max_span_length - 1)
        relative = ops.cast(self.position_embedding(offset), sequence.dtype)  # (B, P, D)
        x = ops.concatenate([left, right, relative], axis=-1)  # (B, P, 2H + D)
        x = self.layer_norm_1(self.dense_1(x))  # (B, P, H)
        x = self.layer_norm_2(self.dense_2(x))  # (B, P, E)
        table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (V, E)
        return tied_logits(x, table) + ops.cast(self.bias, x.dtype)  # (B, P, V)

    def compute_output_shape(self, sequence_shape, positions_shape=None, span_starts_shape=None,
                             span_ends_shape=None):
        return (sequence_shape[0], positions_shape[1], self.vocabulary_size)

    def get_config(self):
        # Tied to the backbone's token table: serialized by the task that owns it.
        raise NotImplementedError("SpanBoundaryHead is serialized by the task that owns it.")
