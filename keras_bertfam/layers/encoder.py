"""The one transformer block and the encoder stack every encoder family runs on.

A block is two residual sublayers, self-attention and feed-forward, each followed by (post-LN,
BERT) or preceded by (pre-LN, `norm_first=True`) a LayerNorm. The sublayers are layers of their own
so that ALBERT's sharing ablation can share one without the other: the encoder passes the same
sublayer instance to several blocks, and Keras then tracks its weights once.

A block can compute its output at a subset of positions only (`query_rows`: a Python slice, or
a (B, P) int tensor of each example's positions): the queries, residuals, LayerNorms and
feed-forward run on those rows, the keys and values on every position, and the rows equal those
of the full output. A classifier that reads only [CLS], and an MLM that reads only its masked
positions, run their last layer that way (`TransformerStack(..., last_layer_rows=...)`).
"""
import keras
from keras import ops

from keras_bertfam.layers.attention import MultiHeadSelfAttention, attention_mask
from keras_bertfam.layers.normalization import LayerNormalization
from keras_bertfam.layers.utils import (
    _check_positive,
    clone_initializer,
    matmul_2d,
    serialize_initializer,
    sublayer_kwargs,
    take_rows,
    upstream_of,
    waiting_for,
    zero_after,
)

SHARE_MODES = ("none", "all", "attention", "ffn")


def _keeping_its_input(forward, derivative):
    """`forward` with its gradient `upstream * derivative(x)` written out from x (as torch's
    activations): the output is `forward`'s, bit for bit. One tensor of x's size is kept for the
    backward pass: in a TensorFlow graph the derivative, computed as soon as x exists."""

    @ops.custom_gradient
    def activation(x):
        def grad(*args, upstream=None):
            return upstream_of(args, upstream) * derivative(x)

        # stop_gradient: an eager tape would otherwise record the forward ops too, and hold
        # their intermediates until the gradient (tf.custom_gradient records them eagerly).
        return forward(ops.stop_gradient(x)), grad

    return activation


def _gelu_and_slope(x, approximate, zero=0.0):
    """gelu(x) and its derivative, from x, sharing Φ(x) (the tanh form: its tanh). gelu(x) is
    `tf.nn.gelu`'s formula, op for op: on TensorFlow the bits of Keras' GELU.

    `zero` (0, or `zero_after`'s (1, ..., 1) zero) enters every op that reads x alone (`0.5·x`,
    `-x/√2`, `x³`), through the op's constant (no extra op of x's size), so that in a TensorFlow
    graph every op here runs once `zero`'s tensor exists.
    """
    half_x = x * (0.5 + zero)
    if approximate:
        c, k = 0.7978845608028654, 0.044715  # √(2/π); the cubic's coefficient
        t = ops.tanh(c * (x + k * x ** (3.0 + zero)))
        one_plus_t = 1.0 + t
        y = half_x * one_plus_t
        # d/dx 0.5·x·(1 + tanh(u)), u = c·(x + k·x³): 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3k·x²)
        slope = 0.5 * one_plus_t + half_x * (1.0 - t * t) * (c * (1.0 + (6 * k) * (x * half_x)))
        return y, slope
    minus_x_over_root2 = x * (zero - 0.7071067811865476)  # tf.nn.gelu's -x·(1/√2), same bits
    two_cdf = ops.erfc(minus_x_over_root2)  # 2Φ(x)
    y = half_x * two_cdf
    # Φ(x) + x·φ(x), x·φ(x) = (x/2)·√(2/π)·exp(-x²/2) = (x/2)·exp(ln √(2/π) - x²/2)
    slope = 0.5 * two_cdf + half_x * ops.exp(
        -0.2257913526447274 - minus_x_over_root2 * minus_x_over_root2)
    return y, slope


# On TensorFlow the GELUs' gradients are written out: autodiff through `tf.nn.gelu`'s formula
# keeps its intermediates (x/√2, 0.5x, erfc(...); more for the tanh form), each of the
# feed-forward's [B, T, intermediate_dim] size, alive from the forward pass to the backward one:
# ~0.6 GB of a BERT-base step's peak at 16 x 128. Written out, one tensor of that size is kept
# (the derivative; the feed-forward's `gelu_dense_keeping_input` keeps x and recomputes the GELU's
# output too). Torch's GELU keeps only x; XLA (JAX) fuses it.
_TF_GELU = {
    approximate: _keeping_its_input(
        lambda x, a=approximate: _gelu(x, a),
        lambda x, a=approximate: _gelu_and_slope_of(x, a)[1])
    for approximate in (False, True)
}


def _is_half(dtype):
    return keras.backend.standardize_dtype(dtype) in ("float16", "bfloat16")


def _gelu(x, approximate):
    """Keras' GELU of x. Of a float16 or bfloat16 x, computed in float32 and rounded once to
    x's dtype (as torch's GELU kernels compute a 16-bit tensor's): TensorFlow's 16-bit Erfc is
    a scalar loop on CPU, 4x its float32 time (5.0 vs 1.2 ms on [512, 1536] bfloat16, with the
    two casts 1.6 ms), and 16-bit rounding inside the formula costs digits."""
    if _is_half(x.dtype):
        return ops.cast(keras.activations.gelu(ops.cast(x, "float32"), approximate=approximate),
                        x.dtype)
    return keras.activations.gelu(x, approximate=approximate)


def _gelu_and_slope_of(x, approximate, zero=0.0):
    """`_gelu_and_slope` in x's dtype; of a float16 or bfloat16 x computed in float32 and each
    rounded once to x's dtype (its gelu(x): `_gelu`'s bits)."""
    if not _is_half(x.dtype):
        return _gelu_and_slope(x, approximate, zero)
    if not isinstance(zero, float):
        # The cast, too, waits for `zero` (else a graph casts x in the forward pass and holds
        # the float32 copy, twice x's size, until the gradient).
        x = waiting_for(x, zero)
        zero = ops.cast(zero, "float32")
    y, slope = _gelu_and_slope(ops.cast(x, "float32"), approximate, zero)
    return ops.cast(y, x.dtype), ops.cast(slope, x.dtype)


def gelu_dense_keeping_input(x, kernel, bias, approximate=False):
    """`ops.add(ops.matmul(gelu(x), kernel), bias)` (Keras' GELU, then Keras' Dense's call on its
    output), the same output bit for bit (the same ops in the same order; of a float16 or
    bfloat16 x the GELU is computed in float32 and rounded once, `_gelu`), with the gradient
    written out from x and the kernel: x (..., F), kernel (F, H), bias (H,), one dtype.

    TensorFlow's autodiff keeps two tensors of x's size from the forward pass to the backward
    one, the GELU's derivative (or x) for the GELU's gradient and gelu(x) for the kernel's (24 MB
    each a layer at BERT-base 16 x 128). Here only x is kept: the backward pass recomputes gelu(x)
    with the derivative, which computes Φ(x) anyway (one multiplication more), once the
    upstream gradient g exists (`zero_after`: else a TensorFlow graph computes and holds it in the
    forward pass). With y = gelu(x), sums over every axis but the last:

        d_kernel = Σ yᵀg;  d_bias = Σ g;  dx = (g · kernelᵀ) · gelu'(x)

    equal to autodiff's within float32 rounding (tested on TensorFlow, JAX and torch).
    """

    @ops.custom_gradient
    def gelu_dense(x, kernel, bias):
        # stop_gradient: an eager TensorFlow tape would otherwise record the forward ops too,
        # and hold their intermediates (gelu(x)) until the gradient.
        y = _gelu(ops.stop_gradient(x), approximate)
        out = ops.add(ops.matmul(y, ops.stop_gradient(kernel)), ops.stop_gradient(bias))

        def grad(*args, upstream=None):
            upstream = upstream_of(args, upstream)
            units, width = kernel.shape
            y, slope = _gelu_and_slope_of(x, approximate, zero_after(upstream))
            rows = _as_rows(upstream, width)  # (N, H)
            d_kernel = matmul_2d(_as_rows(y, units), rows, transpose_a=True)  # (F, H)
            # In float32 at least, as BiasAdd's gradient (Keras' ops.add of a bias on TF) sums.
            total = keras.backend.result_type(upstream.dtype, "float32")
            d_bias = ops.cast(ops.sum(ops.cast(rows, total), axis=0), upstream.dtype)
            d_y = matmul_2d(rows, kernel, transpose_b=True)  # (N, F)
            d_y = d_y if len(x.shape) == 2 else ops.reshape(d_y, ops.shape(x))
            return d_y * slope, d_kernel, d_bias

        return out, grad

    return gelu_dense(x, kernel, bias)


def _as_rows(x, width):
    """x (..., width) as rows (N, width); a 2-D x as it is (no Reshape op)."""
    return x if len(x.shape) == 2 else ops.reshape(x, (-1, width))


def gelu_exact(x):
    """BERT's erf GELU (the tanh approximation differs by up to ~1e-3)."""
    if keras.backend.backend() == "tensorflow":
        return _TF_GELU[False](x)
    return keras.activations.gelu(x, approximate=False)


def gelu_approximate(x):
    """The tanh GELU (HF's gelu_new: ALBERT's, keras-hub's)."""
    if keras.backend.backend() == "tensorflow":
        return _TF_GELU[True](x)
    return keras.activations.gelu(x, approximate=True)


# Our GELUs -> their `approximate` (the feed-forward's written-out GELU + Dense).
_GELU_FORM = {gelu_exact: False, gelu_approximate: True}


def get_activation(activation):
    if activation == "gelu":
        return gelu_exact
    if activation == "gelu_approximate":
        return gelu_approximate
    return keras.activations.get(activation)


class _Residual(keras.layers.Layer):
    """`x + dropout(f(x))` with a LayerNorm after (post-LN) or before f (pre-LN).

    With `query_rows`, f maps the (normalized) full x to those rows only, and the residual adds
    those rows of x."""

    def __init__(self, norm_first, layer_norm_epsilon, dropout, **kwargs):
        super().__init__(**kwargs)
        self.norm_first = norm_first
        self.layer_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, name="layer_norm", **sublayer_kwargs(self)
        )
        self.dropout_layer = keras.layers.Dropout(dropout, name="dropout", **sublayer_kwargs(self))

    def residual(self, x, f, training, query_rows=None):
        skip = x if query_rows is None else take_rows(x, query_rows)  # (B, Tq, H)
        if self.norm_first:
            return skip + self.dropout_layer(f(self.layer_norm(x)), training=training)
        return self.layer_norm(skip + self.dropout_layer(f(x), training=training))


class AttentionSublayer(_Residual):
    """Residual self-attention: `LN(x + dropout(attention(x)))`.

    `attention_layer`: an attention layer instance to use instead of a `MultiHeadSelfAttention`
    (Longformer's sliding-window attention); it takes the same call arguments (`query_rows` only
    if it is ever given one).

    `query_rows` (call): a Python slice or (B, P) int positions (`take_rows`); the output is
    those rows only, (B, Tq, H).
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        attention_dropout=0.0,
        kernel_initializer="glorot_uniform",
        head_dim=None,
        attention_layer=None,
        **kwargs,
    ):
        super().__init__(norm_first, layer_norm_epsilon, dropout, **kwargs)
        self.attention = attention_layer or MultiHeadSelfAttention(
            num_heads,
            hidden_dim,
            attention_dropout=attention_dropout,
            kernel_initializer=kernel_initializer,
            head_dim=head_dim,
            name="attention",
            **sublayer_kwargs(self),
        )

    def build(self, input_shape):
        self.attention.build(input_shape)
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, head_mask=None, return_attention_scores=False,
             training=False, query_rows=None):
        scores = []
        # Only a subset of rows is asked of the attention layer: Longformer's, which has no
        # query-subset path, is never asked.
        rows = {} if query_rows is None else {"query_rows": query_rows}

        def attend(h):
            out = self.attention(
                h,
                padding_mask=padding_mask,
                head_mask=head_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                **rows,
            )
            if return_attention_scores:
                out, probs = out
                scores.append(probs)
            return out

        y = self.residual(x, attend, training, query_rows)
        return (y, scores[0]) if return_attention_scores else y


class FeedForwardSublayer(_Residual):
    """Residual position-wise MLP: `LN(x + dropout(W2 act(W1 x)))`.

    On TensorFlow, with the GELU (exact or tanh) and a plain float output Dense (Keras' `Dense`
    with a bias, no LoRA, not quantized), `W2 gelu(·)` is one written-out gradient,
    `gelu_dense_keeping_input`: the same outputs bit for bit (in float16 / bfloat16 the GELU
    computed in float32, rounded once: `_gelu`), and the backward pass keeps the GELU's input
    only, not its output too (24 MB less a layer at BERT-base 16 x 128). Otherwise, and on JAX
    and torch, it is the Dense layers' and the activation's own calls.
    """

    def __init__(
        self,
        hidden_dim,
        intermediate_dim,
        activation="gelu",
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(norm_first, layer_norm_epsilon, dropout, **kwargs)
        self.activation = get_activation(activation)
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim, kernel_initializer=clone_initializer(kernel_initializer),
            name="intermediate", **sublayer_kwargs(self),
        )
        self.output_dense = keras.layers.Dense(
            hidden_dim, kernel_initializer=clone_initializer(kernel_initializer), name="output",
            **sublayer_kwargs(self),
        )

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dense.units,))
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, training=False):
        if len(x.shape) < 3:
            return self.residual(x, self._mlp, training)
        # On the rows (B·T, H): the two Dense layers are then plain MatMuls (Keras' Dense on a
        # 3-D input is TensorFlow's tensordot: ~20 shape ops each way) and x's shape is read
        # once for the reshape back. Dropout draws the same numbers (a stateless draw is laid
        # out flat), the LayerNorm and the residual are per row: the same output.
        rows = self.residual(ops.reshape(x, (-1, x.shape[-1])), self._mlp, training)
        return ops.reshape(rows, ops.shape(x))

    def _mlp(self, h):
        inner = self.intermediate_dense(h)
        approximate = _GELU_FORM.get(self.activation)
        dense = self.output_dense
        if (approximate is None or keras.backend.backend() != "tensorflow"
                or not _is_plain_dense(dense, inner)):
            return dense(self.activation(inner))
        with keras.name_scope(dense.name):
            # The weights' values as Dense's call reads them (in its compute dtype; a custom
            # gradient must not read variables itself).
            kernel, bias = (ops.cast(w, dense.compute_dtype) for w in (dense.kernel, dense.bias))
            return gelu_dense_keeping_input(inner, kernel, bias, approximate)


def _is_plain_dense(dense, x):
    """Whether `dense(x)` is `ops.add(ops.matmul(x, kernel), bias)` with the kernel and bias in
    x's dtype, nothing else: Keras' own Dense, built, with a bias, no activation or activity
    regularizer, no LoRA, not quantized, computing in x's dtype, its variables autocast to it
    (or already of it)."""
    return (
        type(dense) is keras.layers.Dense
        and dense.built
        and dense.use_bias
        and dense.bias is not None
        and dense.activation is keras.activations.linear
        and dense.activity_regularizer is None
        and not dense.lora_enabled
        and dense.quantization_mode is None
        and keras.backend.standardize_dtype(x.dtype) == dense.compute_dtype
        and (dense.autocast or dense.variable_dtype == dense.compute_dtype)
    )


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TransformerBlock(keras.layers.Layer):
    """Self-attention + feed-forward, each residual with LayerNorm (Vaswani et al. 2017).

    The one transformer block of the library; `TransformerEncoder` is this block under keras-hub's
    name and defaults. The model width H is the input's last dimension, read at build time
    (`hidden_dim` may be given to build the sublayers at construction instead).

    Args:
        intermediate_dim, num_heads: the feed-forward width (4H in BERT) and the number of heads.
        dropout: on the sublayer outputs (and on the attention probabilities unless
            `attention_dropout` is given).
        activation: "gelu" (exact erf, BERT's), "gelu_approximate", or any Keras activation.
        layer_norm_epsilon, kernel_initializer: as in BERT.
        norm_first: pre-LN instead of BERT's post-LN.
        attention_dropout: dropout on the attention probabilities (default: `dropout`).
        hidden_dim: H, when known before the first call (else inferred from the input).
        attention, feedforward: optional sublayer instances to use (and share) instead of new ones.
        head_dim: head width when `num_heads * head_dim != hidden_dim` (structurally pruned heads).

    Call args: `x` (B, T, H); `padding_mask` (B, T) true/1 for real tokens (or a full (B, T, S)
    mask); `attention_mask` (B, T, S), combined with `padding_mask`; `head_mask`;
    `return_attention_scores` to also return the (B, N, T, S) probabilities; `query_rows` (a
    Python slice of positions, or a (B, P) int tensor of each example's) to compute the output at those rows only, (B, Tq, H): queries,
    residuals, LayerNorms and feed-forward on those rows, keys and values on all of x; the rows
    equal those of the full output (in training, dropout draws masks of the smaller shape).

    Example:
    >>> block = TransformerBlock(intermediate_dim=16, num_heads=2)
    >>> tuple(block(ops.ones((1, 3, 8)), padding_mask=ops.ones((1, 3))).shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        intermediate_dim,
        num_heads,
        dropout=0.0,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        norm_first=False,
        attention_dropout=None,
        hidden_dim=None,
        attention=None,
        feedforward=None,
        head_dim=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_positive(intermediate_dim=intermediate_dim)
        if (not isinstance(num_heads, int) or isinstance(num_heads, bool)
                or num_heads < (0 if head_dim else 1)):  # 0: every head pruned (head_dim given)
            raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}.")
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._shared_sublayers = attention is not None or feedforward is not None
        self.attention = attention
        self.feedforward = feedforward
        if hidden_dim is not None:
            self._make_sublayers(hidden_dim)

    def _make_sublayers(self, hidden_dim):
        common = dict(
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            kernel_initializer=self.kernel_initializer,
            **sublayer_kwargs(self),
        )
        if self.attention is None:
            attention_dropout = (
                self.dropout if self.attention_dropout is None else self.attention_dropout
            )
            self.attention = AttentionSublayer(
                hidden_dim, self.num_heads, attention_dropout=attention_dropout,
                head_dim=self.head_dim, name="self_attention", **common
            )
        if self.feedforward is None:
            self.feedforward = FeedForwardSublayer(
                hidden_dim, self.intermediate_dim, activation=self.activation,
                name="feedforward", **common
            )

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if self.hidden_dim is not None and hidden_dim is not None and hidden_dim != self.hidden_dim:
            raise ValueError(
                f"TransformerBlock(hidden_dim={self.hidden_dim}) got inputs of width "
                f"{hidden_dim}: input shape {tuple(input_shape)}."
            )
        if hidden_dim is None:
            raise ValueError(
                f"TransformerBlock needs a known last input dimension (the model width), got "
                f"input shape {tuple(input_shape)}."
            )
        self._make_sublayers(hidden_dim)
        if not self.attention.built:
            self.attention.build(input_shape)
        if not self.feedforward.built:
            self.feedforward.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, attention_mask=None, head_mask=None,
             return_attention_scores=False, training=False, query_rows=None):
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")  # (B, T, S)
            if padding_mask is not None:
                mask = ops.logical_and(mask, ops.cast(padding_mask, "bool")[:, None, :])
            padding_mask = mask
        x = self.attention(
            x,
            padding_mask=padding_mask,
            head_mask=head_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            query_rows=query_rows,
        )
        if return_attention_scores:
            x, probs = x
            return self.feedforward(x, training=training), probs
        return self.feedforward(x, training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def _config_values(self):
        return dict(
            intermediate_dim=self.intermediate_dim,
            num_heads=self.num_heads,
            dropout=self.dropout,
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
            norm_first=self.norm_first,
            attention_dropout=self.attention_dropout,
            hidden_dim=self.hidden_dim,
        ) | ({} if self.head_dim is None else {"head_dim": self.head_dim})

    def get_config(self):
        if self._shared_sublayers:
            raise NotImplementedError(
                "A TransformerBlock built around shared sublayers is serialized by its "
                "TransformerStack, not on its own."
            )
        config = super().get_config()
        config.update(self._config_values())
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TransformerEncoder(TransformerBlock):
    """keras-hub's `TransformerEncoder`: one `TransformerBlock` with keras-hub's arguments and
    defaults (ReLU, LayerNorm epsilon 1e-5, `normalize_first`, `bias_initializer`).

    Example:
    >>> encoder = TransformerEncoder(intermediate_dim=16, num_heads=2)
    >>> tuple(encoder(ops.ones((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        intermediate_dim,
        num_heads,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-05,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        normalize_first=False,
        **kwargs,
    ):
        if keras.initializers.get(bias_initializer).__class__ is not keras.initializers.Zeros:
            raise ValueError(
                f"TransformerEncoder supports bias_initializer='zeros' only, got "
                f"{bias_initializer!r}."
            )
        super().__init__(
            intermediate_dim,
            num_heads,
            dropout=dropout,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer,
            norm_first=normalize_first,
            **kwargs,
        )
        self.bias_initializer = "zeros"
        self.normalize_first = normalize_first

    def _config_values(self):
        config = super()._config_values()
        config["normalize_first"] = config.pop("norm_first")
        config["bias_initializer"] = self.bias_initializer
        return config


def sharing_plan(num_layers, num_groups, share):
    """Which attention and feed-forward sublayer each layer uses.

    Layer i belongs to group `int(i / L * G)` (ALBERT's `int(layer_idx / num_hidden_layers *
    num_hidden_groups)`). A shared kind of sublayer has one instance per group; an unshared kind has
    one per layer. Returns `(attention_index, feedforward_index)`, two lists of length L.

    >>> sharing_plan(4, 2, "attention")
    ([0, 0, 1, 1], [0, 1, 2, 3])
    """
    if share not in SHARE_MODES:
        raise ValueError(f"share must be one of {SHARE_MODES}, got {share!r}.")
    if not 1 <= num_groups <= num_layers:
        raise ValueError(f"num_groups must be in [1, num_layers={num_layers}], got {num_groups}.")
    group = [int(i / num_layers * num_groups) for i in range(num_layers)]
    own = list(range(num_layers))
    return (
        group if share in ("all", "attention") else own,
        group if share in ("all", "ffn") else own,
    )


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TransformerStack(keras.layers.Layer):
    """A stack of `num_layers` transformer blocks, optionally sharing weights across layers.

    `share="none"` (BERT) gives every layer its own block. ALBERT's cross-layer sharing (Lan et al.
    2020, Table 4) shares "all" parameters, only the "attention" sublayers, or only the "ffn"
    sublayers among the layers of a group; with `num_groups=1` every layer shares. With
    `num_inner_repetitions=R` (keras-hub's ALBERT argument, HF's `inner_group_num`) a group holds R
    distinct blocks and each of its layers runs all R in turn (share="all" only).

    Call returns the last hidden states, or `(last, all_hidden_states, all_attention_probs)` with
    `return_all=True` (one entry per block call). With `last_layer_rows` (a Python slice of
    positions, or a (B, P) int tensor of each example's) the last block call computes only those
    rows (`TransformerBlock`'s `query_rows`) and the stack returns (B, Tq, H): exactly those rows
    of the full output, for a task that reads only them (a classifier's [CLS], an MLM's masked
    positions).

    `heads_per_layer` (a list of L ints, default `num_heads` everywhere) gives each layer its own
    number of heads, all `hidden_dim // num_heads` wide: what `kb.analysis.prune_heads` leaves.
    Layers that share an attention sublayer must keep the same number. `head_mask` is an (L, N)
    tensor, or a list of L per-layer (N_i,) / (B, N_i) multipliers when the counts differ.

    Example:
    >>> stack = TransformerStack(2, 8, 2, 16)
    >>> tuple(stack(ops.ones((1, 3, 8))).shape), len(stack.blocks)
    ((1, 3, 8), 2)
    """

    def __init__(
        self,
        num_layers,
        hidden_dim,
        num_heads,
        intermediate_dim,
        activation="gelu",
        norm_first=False,
        layer_norm_epsilon=1e-12,
        dropout=0.0,
        attention_dropout=None,
        kernel_initializer="glorot_uniform",
        num_groups=None,
        share="none",
        heads_per_layer=None,
        num_inner_repetitions=1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_positive(num_inner_repetitions=num_inner_repetitions)
        if num_inner_repetitions > 1 and share != "all":
            raise ValueError(
                f"num_inner_repetitions={num_inner_repetitions} needs share='all' (the blocks of "
                f"a group are whole blocks), got share={share!r}."
            )
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.num_groups = num_groups or (1 if share != "none" else num_layers)
        self.share = share
        self.heads_per_layer = None if heads_per_layer is None else [int(n) for n in
                                                                        heads_per_layer]
        self.num_inner_repetitions = num_inner_repetitions

        block_args = dict(
            intermediate_dim=intermediate_dim,
            num_heads=num_heads,
            dropout=dropout,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=self.kernel_initializer,
            norm_first=norm_first,
            attention_dropout=attention_dropout,
            hidden_dim=hidden_dim,
            **sublayer_kwargs(self),
        )
        attention_index, feedforward_index = sharing_plan(num_layers, self.num_groups, share)
        heads_of = _heads_of_attention(self.heads_per_layer, num_layers, num_heads, hidden_dim,
                                       attention_index)

        def pruned(args, index):
            """Block / sublayer arguments for attention sublayer `index` (its head count)."""
            if heads_of is None:
                return args
            return dict(args, num_heads=heads_of[index], head_dim=hidden_dim // num_heads)

        repeats = num_inner_repetitions
        self.blocks = []
        if share == "all" or self.num_groups == num_layers:
            # R blocks per distinct group index; layer i calls the blocks of its group.
            unique = sorted(set(attention_index))
            self.blocks = [
                TransformerBlock(
                    name=f"block_{g}" if repeats == 1 else f"block_{g}_{r}",
                    **pruned(block_args, g),
                )
                for g in unique
                for r in range(repeats)
            ]
            # The float formula can skip a group (L=22, G=22: layers 14 and 15 share group 14, as
            # in the original code), so index blocks by rank among the groups in use.
            self._blocks_of_layer = [
                [unique.index(g) * repeats + r for r in range(repeats)] for g in attention_index
            ]
        else:
            # Partial sharing: L blocks over shared sublayer instances.
            common = dict(
                norm_first=norm_first, layer_norm_epsilon=layer_norm_epsilon, dropout=dropout,
                kernel_initializer=self.kernel_initializer, **sublayer_kwargs(self),
            )
            attentions = {
                i: AttentionSublayer(
                    name=f"self_attention_{i}",
                    attention_dropout=dropout if attention_dropout is None else attention_dropout,
                    **pruned(dict(hidden_dim=hidden_dim, num_heads=num_heads), i),
                    **common,
                )
                for i in sorted(set(attention_index))
            }
            feedforwards = {
                i: FeedForwardSublayer(
                    hidden_dim, intermediate_dim, activation=activation,
                    name=f"feedforward_{i}", **common,
                )
                for i in sorted(set(feedforward_index))
            }
            self.blocks = [
                TransformerBlock(
                    name=f"block_{i}",
                    attention=attentions[attention_index[i]],
                    feedforward=feedforwards[feedforward_index[i]],
                    **pruned(block_args, attention_index[i]),
                )
                for i in range(num_layers)
            ]
            self._blocks_of_layer = [[i] for i in range(num_layers)]

    def layer_block(self, i):
        """The block that layer i runs (its first block when `num_inner_repetitions > 1`)."""
        return self.blocks[self._blocks_of_layer[i][0]]

    def layer_blocks(self, i):
        """Every block that layer i runs, in order."""
        return [self.blocks[k] for k in self._blocks_of_layer[i]]

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, head_mask=None, return_all=False, training=False,
             last_layer_rows=None):
        if return_all and last_layer_rows is not None:
            raise ValueError("return_all=True returns every layer's full states; it takes no "
                             f"last_layer_rows (got {last_layer_rows}).")
        if head_mask is None:
            # Set by `kb.analysis` around a task's call, to differentiate with respect to it.
            head_mask = getattr(self, "head_mask_override", None)
        if padding_mask is not None and len(padding_mask.shape) == 2:
            # The (B, 1, 1, T) boolean key mask, made once for every layer, not once a layer.
            padding_mask = attention_mask(padding_mask)
        hidden_states, attention_probs = [x], []
        calls = [(i, block) for i in range(self.num_layers) for block in self.layer_blocks(i)]
        for n, (i, block) in enumerate(calls):
            layer_head_mask = None if head_mask is None else head_mask[i]
            x = block(
                x,
                padding_mask=padding_mask,
                head_mask=layer_head_mask,
                return_attention_scores=return_all,
                training=training,
                query_rows=last_layer_rows if n == len(calls) - 1 else None,
            )
            if return_all:
                x, probs = x
                hidden_states.append(x)
                attention_probs.append(probs)
        if return_all:
            return x, hidden_states, attention_probs
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            hidden_dim=self.hidden_dim,
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
            num_groups=self.num_groups,
            share=self.share,
            num_inner_repetitions=self.num_inner_repetitions,
        )
        if self.heads_per_layer is not None:
            config["heads_per_layer"] = self.heads_per_layer
        return config


def _heads_of_attention(heads_per_layer, num_layers, num_heads, hidden_dim, attention_index):
    """{attention sublayer index: its number of heads}, or None when no layer was pruned.

    Raises when layers sharing one attention sublayer (ALBERT) are given different counts."""
    if heads_per_layer is None:
        return None
    if len(heads_per_layer) != num_layers or any(
            not 0 <= n <= num_heads for n in heads_per_layer):
        raise ValueError(
            f"heads_per_layer must list {num_layers} head counts in [0, num_heads={num_heads}], "
            f"got {heads_per_layer}.")
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}.")
    heads = {}
    for layer, index in enumerate(attention_index):
        if heads.setdefault(index, heads_per_layer[layer]) != heads_per_layer[layer]:
            raise ValueError(
                f"Layers sharing attention sublayer {index} must keep the same number of heads; "
                f"heads_per_layer={heads_per_layer}.")
    return heads
