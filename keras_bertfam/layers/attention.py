"""Multi-head self-attention over `keras.ops.dot_product_attention`."""
import math

import keras
import numpy as np
from keras import ops

from keras_bertfam.layers.utils import (
    clone_initializer,
    rows_matmul,
    serialize_initializer,
    sublayer_kwargs,
    take_rows,
    upstream_of,
    zero_after,
)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class HeadsDense(keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` for an attention's projections into heads ("btd,dnh->btnh")
    and out of them ("btnh,nhd->btd"): the same weights, config and output, computed as one 2-D
    matmul of the rows (`rows_matmul`; its backward pass is 2-3x faster on TensorFlow's CPU).
    LoRA, quantized kernels and other equations take EinsumDense's own path."""

    _CONTRACTED = {"btd,dnh->btnh": 1, "btnh,nhd->btd": 2}

    def takes_rows(self, rank):
        """Whether an input of this rank takes the rows path (`call_on_rows`)."""
        contracted = self._CONTRACTED.get(self.equation)
        return (contracted is not None and not self.lora_enabled
                and self.quantization_mode is None and rank == 2 + contracted)

    def call(self, inputs, training=None):
        if not self.takes_rows(len(inputs.shape)):
            return super().call(inputs, training=training)
        contracted = self._CONTRACTED[self.equation]
        width = int(np.prod(inputs.shape[len(inputs.shape) - contracted:]))
        lead = tuple(ops.shape(inputs))[:2]  # (B, T)
        return self.call_on_rows(ops.reshape(inputs, (-1, width)), lead)

    # === Saving: a LoRA layer's factors kept apart ===
    # Keras' EinsumDense saves a LoRA layer's merged kernel and zeroes both factors when loading
    # into one, after which neither gets a gradient: a LoRA run resumed from a backup or a
    # checkpoint (`load_weights`) would train its biases only. Here a LoRA layer saves its base
    # kernel, bias, factors and scale; a layer without LoRA merges them when it loads them (a
    # `.keras` file or preset of a LoRA model loads as plain layers); a LoRA layer given a plain
    # kernel keeps it and starts new factors (as `enable_lora` does) instead of zeros.
    def _lora_values(self):
        bias = [] if self.bias is None else [self.bias]
        scale = np.float32(self.lora_alpha / self.lora_rank)
        return [self._kernel, *bias, self.lora_kernel_a, self.lora_kernel_b, scale]

    def save_own_variables(self, store):
        if not (self.built and self.lora_enabled and self.quantization_mode is None):
            return super().save_own_variables(store)
        for i, value in enumerate(self._lora_values()):
            store[str(i)] = value

    def load_own_variables(self, store):
        plain = 1 + (self.bias is not None)
        if self.quantization_mode is not None or len(store.keys()) not in (plain, plain + 3):
            return super().load_own_variables(store)
        values = [store[str(i)] for i in range(len(store.keys()))]
        if len(values) == plain + 3:  # saved with LoRA
            kernel, (a, b, scale) = values[0], values[plain:]
            if self.lora_enabled:
                for variable, value in zip(self._lora_values()[:-1], values[:-1]):
                    variable.assign(value)
                return
            merged = ops.add(kernel, ops.multiply(
                ops.cast(np.asarray(scale), "float32"), ops.matmul(a, b)))
            values = [ops.cast(merged, self._kernel.dtype)] + values[1:plain]
        self._kernel.assign(values[0])
        if self.bias is not None:
            self.bias.assign(values[1])
        if self.lora_enabled:  # a plain kernel: new factors, their product zero
            self.lora_kernel_a.assign(keras.initializers.HeUniform()(self.lora_kernel_a.shape))
            self.lora_kernel_b.assign(ops.zeros(self.lora_kernel_b.shape))

    def call_on_rows(self, rows, lead):
        """The layer's output from its input's rows (B·T, K) (its contracted axes flattened)
        and `lead`, (B, T): one MatMul, the bias added to the (B·T, M) product as a vector
        (TensorFlow's BiasAdd, whose gradient is one BiasAddGrad, where a bias of two axes
        added to the 4-D output took a broadcast gradient of ~7 ops), one reshape to the
        output's axes. The same sums as EinsumDense's, bit for bit on TensorFlow."""
        outer = tuple(self.kernel.shape)[self._CONTRACTED[self.equation]:]
        x = rows_matmul(rows, self.kernel, self._CONTRACTED[self.equation], rows_given=True)
        # A bias over every output axis ("nh", "d") is added to the rows as a vector; another
        # (e.g. bias_axes="h") broadcasts over the output's axes, as EinsumDense adds it.
        row_bias = self.bias is not None and tuple(self.bias.shape) == outer
        if row_bias:
            x = ops.add(x, ops.reshape(self.bias, (-1,)) if len(outer) > 1 else self.bias)
        x = ops.reshape(x, tuple(lead) + outer)
        if self.bias is not None and not row_bias:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Scaled dot-product self-attention with separate Q, K, V and output projections.

    The fused `ops.dot_product_attention` kernel runs whenever it can; the explicit softmax path is
    taken only when something needs the probabilities themselves: attention dropout in training,
    `return_attention_scores=True`, or a `head_mask` (Michel et al. 2019, "Are sixteen heads really
    better than one?"). Both paths give the same numbers (tested).

    Args:
        num_heads: number of heads N; `hidden_dim` must be divisible by it unless `head_dim` is
            given. 0 (every head pruned) leaves only the output bias.
        hidden_dim: model width H (head width H / N).
        head_dim: the head width, when N * head_dim != H (a structurally pruned layer keeps its
            original head width; `kb.analysis.prune_heads`).
        attention_dropout: dropout on the attention probabilities.
        kernel_initializer: for the four projections.

    Call args:
        x: (B, T, H).
        padding_mask: (B, T), true/1 for real tokens; or a full (B, T, T) attention mask; or
            either as `attention_mask` makes it, (B, 1, 1|T, T) boolean.
        head_mask: optional (N,) or (B, N): multiplies each head's probabilities.
        return_attention_scores: also return the (B, N, T, T) probabilities.
        query_rows: a Python slice of positions, or a (B, P) int tensor of each example's
            positions (`take_rows`): queries (and outputs) only at those rows, keys and values
            still from every position; the output is (B, Tq, H) and equals those rows of the
            full output (the [CLS]-only last layer of a classifier, the masked rows of an MLM).

    Example:
    >>> layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    >>> tuple(layer(ops.ones((1, 3, 8)), padding_mask=ops.ones((1, 3))).shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        num_heads,
        hidden_dim,
        attention_dropout=0.0,
        kernel_initializer="glorot_uniform",
        head_dim=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._head_dim_arg = head_dim  # serialized only when given (older configs lack it)
        if head_dim is None:
            if num_heads <= 0 or hidden_dim % num_heads:
                raise ValueError(
                    f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}."
                )
            head_dim = hidden_dim // num_heads
        elif num_heads < 0 or head_dim <= 0:
            raise ValueError(
                f"num_heads must be >= 0 and head_dim > 0, got num_heads={num_heads}, "
                f"head_dim={head_dim}."
            )
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.head_dim = head_dim
        self.attention_dropout = attention_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        # === Layers ===
        common = sublayer_kwargs(self)

        def projection(name):
            return HeadsDense(
                "btd,dnh->btnh",
                output_shape=(None, num_heads, self.head_dim),
                bias_axes="nh",
                kernel_initializer=clone_initializer(self.kernel_initializer),
                name=name,
                **common,
            )

        self.query_dense = self.key_dense = self.value_dense = self.output_dense = None
        if num_heads:
            self.query_dense = projection("query")
            self.key_dense = projection("key")
            self.value_dense = projection("value")
            self.output_dense = HeadsDense(
                "btnh,nhd->btd",
                output_shape=(None, hidden_dim),
                bias_axes="d",
                kernel_initializer=clone_initializer(self.kernel_initializer),
                name="attention_output",
                **common,
            )
        self.dropout_layer = keras.layers.Dropout(
            attention_dropout, name="attention_dropout", **common)

    def build(self, input_shape):
        if self.num_heads == 0:
            # Every head pruned: the sublayer adds only the output projection's bias.
            self.output_bias = self.add_weight(
                shape=(self.hidden_dim,), initializer="zeros", name="attention_output_bias")
            self.built = True
            return
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(input_shape)
        self.output_dense.build(tuple(input_shape[:2]) + (self.num_heads, self.head_dim))
        self.built = True

    # === Call ===
    def call(
        self,
        x,
        padding_mask=None,
        head_mask=None,
        return_attention_scores=False,
        training=False,
        query_rows=None,
    ):
        xq = x if query_rows is None else take_rows(x, query_rows)  # (B, Tq, H)
        if self.num_heads == 0:
            output = ops.zeros_like(xq) + ops.cast(self.output_bias, x.dtype)  # (B, Tq, H)
            if not return_attention_scores:
                return output
            shape = (ops.shape(x)[0], 0, ops.shape(xq)[1], ops.shape(x)[1])
            return output, ops.zeros(shape, dtype=x.dtype)
        q, k, v, lead = self._project(x, xq)  # (B, Tq, N, Hd), (B, S, N, Hd) x 2
        if query_rows is not None and padding_mask is not None and len(padding_mask.shape) == 3:
            padding_mask = take_rows(padding_mask, query_rows)  # (B, Tq, S)
        mask = attention_mask(padding_mask)  # (B, 1, 1|Tq, S) bool, or None
        explicit = (
            return_attention_scores
            or head_mask is not None
            or (training and self.attention_dropout > 0)
        )
        # XLA on CPU has no float16 dot with a float32 accumulator, which JAX's fused attention
        # asks for: take the explicit path there (same numbers).
        if keras.backend.standardize_dtype(q.dtype) == "float16" and keras.backend.backend() == "jax":
            explicit = True
        if not explicit:
            context = ops.dot_product_attention(
                q, k, v, mask=mask, scale=1.0 / math.sqrt(self.head_dim)
            )  # (B, Tq, N, Hd)
            return self._output(context, lead)

        # Scale q (B, T, N, Hd) rather than the larger scores (B, N, T, S).
        q = q * ops.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        scores = ops.einsum("btnh,bsnh->bnts", q, k)  # (B, N, Tq, S)
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(_large_negative(scores.dtype), scores.dtype))
        probs = ops.softmax(scores, axis=-1)
        if training and self.attention_dropout > 0 and not return_attention_scores \
                and head_mask is None:
            # fit's path: the backward pass keeps probs (softmax's gradient keeps them anyway), v
            # and a bool mask, not the dropped probabilities.
            context = dropout_attention_context(probs, v, self.dropout_layer)
            return self._output(context, lead)
        probs = self.dropout_layer(probs, training=training)
        if head_mask is not None:
            head_mask = ops.cast(head_mask, probs.dtype)
            head_mask = ops.reshape(head_mask, (-1, self.num_heads, 1, 1))  # (1|B, N, 1, 1)
            probs = probs * head_mask
        context = ops.einsum("bnts,bsnh->btnh", probs, v)  # (B, Tq, N, Hd)
        output = self._output(context, lead)
        return (output, probs) if return_attention_scores else output

    def _project(self, x, xq):
        """The queries of xq, keys and values of x, and (B, T) when they were computed on x's
        rows (else None). When xq is x and the three projections
        take the rows path, x is flattened to its rows once for all three (one Reshape and
        one read of x's shape, not three): each layer's `call_on_rows`, in this layer's call
        (the same dtype policy, so the same autocast of the kernels)."""
        dense = (self.query_dense, self.key_dense, self.value_dense)
        if xq is not x or not all(d.takes_rows(len(x.shape)) for d in dense):
            return self.query_dense(xq), self.key_dense(x), self.value_dense(x), None
        rows = ops.reshape(x, (-1, x.shape[-1]))  # (B·T, D)
        lead = tuple(ops.shape(x))[:2]  # (B, T)
        out = []
        for d in dense:
            with keras.name_scope(d.name):
                out.append(d.call_on_rows(rows, lead))
        return (*out, lead)

    def _output(self, context, lead):
        """The output projection of the context (B, T, N, Hd); with `lead` (B, T) from
        `_project`, on its rows without reading its shape again."""
        if lead is None or not self.output_dense.takes_rows(len(context.shape)):
            return self.output_dense(context)
        with keras.name_scope(self.output_dense.name):
            rows = ops.reshape(context, (-1, self.num_heads * self.head_dim))  # (B·T, N·Hd)
            return self.output_dense.call_on_rows(rows, lead)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    # === Config ===
    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            attention_dropout=self.attention_dropout,
            kernel_initializer=serialize_initializer(self.kernel_initializer),
        )
        if self._head_dim_arg is not None:
            config["head_dim"] = self._head_dim_arg
        return config


def _large_negative(dtype):
    """A masked score: -1e9, or float16's most negative finite value (-1e9 overflows to -inf)."""
    return -65500.0 if keras.backend.standardize_dtype(dtype) == "float16" else -1e9


def attention_mask(padding_mask):
    """(B, T) padding mask -> (B, 1, 1, T) boolean key mask; (B, T, S) -> (B, 1, T, S); a
    mask of rank 4 is one of those already, returned as it is (`TransformerStack` makes its
    padding mask's once for all its layers)."""
    if padding_mask is None:
        return None
    if len(padding_mask.shape) == 4:
        return padding_mask
    mask = ops.cast(padding_mask, "bool")
    if len(mask.shape) == 2:
        return mask[:, None, None, :]
    return mask[:, None, :, :]


def dropout_attention_context(probs, v, dropout_layer):
    """`ops.einsum("bnts,bsnh->btnh", dropout_layer(probs, training=True), v)`, the context of
    dropped attention probabilities (B, N, T, S) and values (B, S, N, H), whose backward pass
    keeps `probs`, `v` and a bool keep-mask (1 byte an element) instead of the dropped
    probabilities.

    Plain autodiff keeps the dropped probabilities for the einsum's gradient (and dropout's mask
    for its own), on top of the probabilities softmax's gradient keeps: one more float tensor of
    the probabilities' size per attention layer (12.6 MB at BERT-base, 16 x 128) held from the
    forward pass to the backward one. Here the backward pass rebuilds them from `probs` and the
    mask.

    The mask is read off `dropout_layer`'s own call (the same seed draws): `dropped != 0`. It
    differs from the drawn one only where `probs` is exactly 0 (a masked key), where the rebuilt
    dropped value is 0 either way and the gradient with respect to `probs` (here 0, there the
    scaled upstream) is multiplied by that 0 probability in softmax's gradient. The custom
    gradient's forward is a function of its inputs (`probs`, `v`, the mask) alone: it rebuilds
    the dropped probabilities from `probs` and the mask as the backward pass does, the bits of
    the dropout's output (`_rebuilt_dropout`), because JAX traces that forward again after the
    call (`jax.grad(jax.jit(f))`, `jax.checkpoint`: a forward reading a tensor of the call from
    its closure failed there). Two elementwise ops more in the forward pass (2026-11-29, this
    function's forward and backward at BERT-base 16 x 128, dropout 0.1: TF 44 -> 46.5 ms, torch
    51-54 -> 55-61 ms of CPU; a base train step ~13.5 s). The scaling repeats each backend's
    dropout op for op (`_dropout_scale`) and the backward matmuls are those of TensorFlow's
    autodiff of the forward einsum, so the gradients equal plain autodiff's: bit for bit in
    float32 on TensorFlow and torch, within rounding on JAX and in mixed precision (tested).
    """
    keep = ops.not_equal(dropout_layer(ops.stop_gradient(probs), training=True), 0)

    @ops.custom_gradient
    def context_of(probs, v, keep):
        # stop_gradient: an eager TensorFlow tape would otherwise record the forward ops too
        # (and keep the dropped probabilities for the einsum's gradient).
        dropped = _rebuilt_dropout(ops.stop_gradient(probs), keep, dropout_layer)
        context = ops.einsum("bnts,bsnh->btnh", dropped, ops.stop_gradient(v))

        def grad(*args, upstream=None):
            upstream = upstream_of(args, upstream)
            # As matmuls with transposed operands (which TensorFlow folds into the matmul):
            # a generic einsum for d_v (transposing the (B, N, T, S) operand) cost ~6 ms more
            # a BERT-base layer.
            g = ops.transpose(upstream, (0, 2, 1, 3))  # (B, N, T, H)
            d_dropped = ops.matmul(g, ops.swapaxes(ops.transpose(v, (0, 2, 1, 3)), -1, -2))
            d_probs = ops.where(keep, _dropout_scale(d_dropped, dropout_layer), 0.0)
            # The dropped probabilities again, their zeros read off the upstream gradient
            # (`zero_after`: else TensorFlow computes and holds them in the forward pass).
            again = _rebuilt_dropout(probs, keep, dropout_layer, zero_after(upstream))
            d_v = ops.transpose(ops.matmul(ops.swapaxes(again, -1, -2), g), (0, 2, 1, 3))
            return d_probs, d_v, None  # the mask has no gradient

        return context, grad

    return context_of(probs, v, keep)


def _rebuilt_dropout(probs, keep, dropout_layer, zero=0.0):
    """The dropout's output of `probs` where it kept `keep`: `probs` scaled as the backend's
    dropout scales (`_dropout_scale`), `zero` (0, or `zero_after`'s zero) elsewhere."""
    return _dropout_scale(ops.where(keep, probs, zero), dropout_layer)


def _dropout_scale(x, dropout_layer):
    """x scaled by 1 / (1 - rate) as the backend's dropout scales the values it keeps (and so
    its gradient), op for op, in x's dtype."""
    keep_prob = 1.0 - dropout_layer.rate
    backend = keras.backend.backend()
    if backend == "tensorflow":  # tf.nn.experimental.stateless_dropout: x * (1 / keep_prob)
        return x * (1 / keep_prob)
    if (backend == "torch" and dropout_layer.noise_shape is None
            and dropout_layer.seed_generator._initial_seed is None):
        # Keras' unseeded torch dropout is torch's F.dropout; on CPU x * noise, noise the
        # Bernoulli draw divided in place by keep_prob (in x's dtype).
        return x * (ops.ones((), dtype=x.dtype) / keep_prob)
    return x / keep_prob  # JAX's and seeded torch's dropout: select(mask, x / keep_prob, 0)
