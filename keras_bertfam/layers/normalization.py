"""LayerNorm whose backward pass keeps its input and two per-row statistics, nothing more."""
import keras
from keras import ops

from keras_bertfam.layers.utils import upstream_of, zero_after


def layer_norm_keeping_input(x, gamma, beta, epsilon):
    """`keras.ops.layer_normalization(x, gamma, beta, axis=-1, epsilon)`, the same output bit
    for bit (Keras' ops in Keras' order, in float32 at least, cast back to x's dtype), with the
    gradient written out from x, the rows' mean and 1/σ ((..., 1) each) and gamma.

    TensorFlow's autodiff of Keras' formula keeps x and `rsqrt(var + ε) * gamma`, a second
    tensor of x's size, from the forward pass to the backward one (6 MB per LayerNorm at
    BERT-base 16 x 128, 25 of them a step); torch's `layer_norm` keeps x, mean and 1/σ, as
    this does. The gradient is the usual one:

        x̂ = (x - μ) / σ;  dβ = Σ g;  dγ = Σ g·x̂;
        dx = (1/σ) · (g·γ - mean(g·γ) - x̂ · mean(g·γ·x̂))      (means over the last axis)

    equal to autodiff's within float32 rounding (tested on TensorFlow, JAX and torch).
    """
    dtype = x.dtype
    compute = keras.backend.result_type(dtype, "float32")

    @ops.custom_gradient
    def norm(x, gamma, beta):
        # stop_gradient: an eager TensorFlow tape would otherwise record the forward ops too,
        # and hold their intermediates until the gradient.
        xf = ops.cast(ops.stop_gradient(x), compute)
        gamma_f = ops.cast(ops.stop_gradient(gamma), compute)
        mean, variance = ops.moments(xf, axes=[-1], keepdims=True)  # (..., 1)
        rstd = ops.rsqrt(variance + epsilon)  # (..., 1)
        inv = rstd * gamma_f
        res = -mean * inv + ops.cast(ops.stop_gradient(beta), compute)
        out = ops.cast(xf * inv + res, dtype)

        def grad(*args, upstream=None):
            g = ops.cast(upstream_of(args, upstream), compute)
            # The centred input, rebuilt once the upstream gradient exists (`zero_after`: else
            # TensorFlow computes and holds it in the forward pass).
            x_hat = (ops.cast(x, compute) - (mean + zero_after(g))) * rstd
            batch_axes = tuple(range(len(g.shape) - 1))
            d_beta = ops.sum(g, axis=batch_axes)
            d_gamma = ops.sum(g * x_hat, axis=batch_axes)
            gg = g * gamma_f
            dx = rstd * (gg - ops.mean(gg, axis=-1, keepdims=True)
                         - x_hat * ops.mean(gg * x_hat, axis=-1, keepdims=True))
            return (ops.cast(dx, dtype), ops.cast(d_gamma, gamma.dtype),
                    ops.cast(d_beta, beta.dtype))

        return out, grad

    return norm(x, gamma, beta)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`: the same arguments, weights and outputs; on TensorFlow,
    over the last axis with both gamma and beta, its backward pass keeps the input and the
    rows' statistics only (`layer_norm_keeping_input`), as torch's does. Elsewhere (torch's
    fused kernel, XLA) it is Keras' own call.

    Example:
    >>> layer = LayerNormalization(epsilon=1e-12)
    >>> tuple(layer(ops.ones((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def call(self, inputs):
        rank = len(inputs.shape)
        if (keras.backend.backend() != "tensorflow" or self.rms_scaling or self.gamma is None
                or self.beta is None or [a % rank for a in self.axis] != [rank - 1]):
            return super().call(inputs)
        # The weights' values, read here (a custom gradient must not read variables itself).
        gamma, beta = (ops.cast(w, w.dtype) for w in (self.gamma, self.beta))
        outputs = layer_norm_keeping_input(inputs, gamma, beta, self.epsilon)
        return ops.cast(outputs, self.compute_dtype)
