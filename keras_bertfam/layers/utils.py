"""Small helpers shared by the layers."""
import keras
import numpy as np


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TruncatedNormal(keras.initializers.TruncatedNormal):
    """`keras.initializers.TruncatedNormal` (a normal cut at two standard deviations, values
    beyond redrawn), drawn on the host by NumPy from the initializer's integer seed: the same
    values on every backend, and nothing to compile. Keras' draw compiles a JAX program per
    weight shape and draws four normals a value on torch: a fresh process built a BERT-base in
    3.9 s on JAX and 3.2 on torch (2.2 each with this; TensorFlow 2.2 either way), and a 2-layer
    BERT of new shapes in 2.2 s on JAX (0.13). Same arguments and seeding: an integer or
    unseeded initializer gives the same values at every call (`keras.utils.set_random_seed`
    fixes the unseeded ones' seeds); a `keras.random.SeedGenerator` seed keeps Keras' draw."""

    def __call__(self, shape, dtype=None):
        if not isinstance(self.seed, int):
            return super().__call__(shape, dtype)
        rng = np.random.default_rng(self.seed)
        values = rng.standard_normal(tuple(shape), dtype=np.float32)
        flat = values.reshape(-1)
        redraw = np.flatnonzero(_beyond_two(flat))
        while redraw.size:
            flat[redraw] = drawn = rng.standard_normal(redraw.size, dtype=np.float32)
            redraw = redraw[_beyond_two(drawn)]
        values *= np.float32(self.stddev)
        values += np.float32(self.mean)
        return keras.ops.convert_to_tensor(values, dtype=dtype or keras.config.floatx())


def _beyond_two(values):
    """|values| > 2, without `np.abs`'s float32 copy of the values: on a base-size embedding
    (38.6M values) the copy's fresh pages cost more CPU (0.35 s) than drawing the values (0.31)."""
    beyond = values > 2
    beyond |= values < -2
    return beyond


def gather_positions(sequence, positions):
    """(B, T, H) states at (B, P) int positions -> (B, P, H)."""
    positions = keras.ops.cast(positions, "int32")
    return keras.ops.take_along_axis(sequence, positions[:, :, None], axis=1)


def take_rows(x, rows):
    """x's rows along axis 1, (B, T, ...) -> (B, Tq, ...): `rows` a Python slice (the same rows
    for every example: `x[:, rows]`) or a (B, P) int tensor of positions, each example's own
    (`gather_positions`). The rows a block computes when given `query_rows`."""
    if isinstance(rows, slice):
        return x[:, rows]
    return gather_positions(x, rows)


def clone_initializer(initializer):
    """A fresh initializer with the same config, so that no two variables share a seeded instance."""
    if isinstance(initializer, keras.initializers.Initializer):
        return initializer.__class__.from_config(initializer.get_config())
    return keras.initializers.get(initializer)


def serialize_initializer(initializer):
    return keras.initializers.serialize(keras.initializers.get(initializer))


def sublayer_kwargs(layer):
    """Keyword arguments every sublayer of `layer` gets: its dtype policy (as Keras'
    `_get_common_kwargs_for_sublayer`), so that `dtype="bfloat16"` or `"mixed_float16"` reaches
    every weight and every computation, not only the outer layer."""
    return {"dtype": layer.dtype_policy}


def upstream_of(args, upstream):
    """The upstream gradient a `keras.ops.custom_gradient` grad function `grad(*args,
    upstream=None)` receives: TensorFlow and JAX call `grad(upstream)`, torch
    `grad(*the forward's inputs, upstream=...)`. Those inputs are the very tensors the forward
    function took (torch saves them for the backward pass), so a grad reads them from its
    closure on every backend."""
    return args[0] if upstream is None else upstream


def zero_after(upstream):
    """A zero of shape (1, ..., 1) (upstream's rank) read off `upstream`'s first element (NaN
    where that element is NaN), for a written-out gradient that rebuilds a forward tensor: with
    this dependency a TensorFlow graph computes the tensor once the upstream gradient exists, in
    the backward pass; without it, as soon as its forward inputs exist, in the forward pass, and
    holds it until the gradient. One slice of every axis (a StridedSlice; flattening first
    added a Reshape and its shape, ~27 times a MiniLM train step)."""
    first = upstream[(slice(0, 1),) * len(upstream.shape)]  # (1, ..., 1)
    return keras.ops.where(keras.ops.equal(first, first), 0.0, first)


def waiting_for(x, zero):
    """x, in a TensorFlow graph read only once `zero` (a `zero_after` zero) exists: an Identity
    under a control dependency, no op of x's size. For a written-out gradient's op that reads a
    forward tensor alone and cannot take `zero` through a constant (a cast), so that the graph
    runs it in the backward pass instead of holding its result from the forward one. Elsewhere
    (eager, JAX, torch: the gradient runs when it is asked for) x itself."""
    if keras.backend.backend() != "tensorflow":
        return x
    import tensorflow as tf

    if tf.executing_eagerly():
        return x
    with tf.control_dependencies([zero]):
        return tf.identity(x)


def matmul_2d(a, b, transpose_a=False, transpose_b=False):
    """`keras.ops.matmul` of two matrices, either transposed first. On TensorFlow its MatMul's own
    flags (as its autodiff's matmuls): Grappler folds a transpose into the matmul's b but not its
    a (a 24 MB transpose of gelu(x) a layer at BERT-base), and without Grappler (tests, eager) a
    transpose of the kernel alone would be computed in the forward pass and held. Elsewhere
    `keras.ops.transpose` (torch's is a view, XLA fuses it)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    return keras.ops.matmul(keras.ops.transpose(a) if transpose_a else a,
                            keras.ops.transpose(b) if transpose_b else b)


def rows_matmul(x, kernel, contracted=1, transpose_kernel=False, rows_given=False):
    """`x` (..., *K) times `kernel` (*K, *M) over K (x's last `contracted` axes and as many
    leading axes of the kernel; with `transpose_kernel`, a kernel (*M, *K) and its last ones)
    -> (..., *M), as ONE 2-D matmul of x's rows (its leading axes flattened).

    The attention's projections are such products ("btd,dnh->btnh" into heads, "btnh,nhd->btd"
    out of them). Keras' TensorFlow einsum computes them, when the sequence length is static, as
    a matmul of the 3-D x by the kernel broadcast over the batch (BatchMatMulV2), whose
    kernel gradient is a product per example reduced over the batch: fwd + bwd of one
    [16 x 128, 768] -> [12, 64] projection took 108.6 ms, 43.7 ms as this 2-D matmul (65.5 ms
    by TensorFlow's Einsum op, the path of an unknown length); at MiniLM's fine-tuning
    [32 x 16, 384]: 14.0 / 5.5 -> 3.7 ms (float32, oneDNN on, idle).

    `rows_given`: x is already the rows (N, prod K), and the product is returned as rows
    (N, prod M), unreshaped. A 2-D kernel is used as it is (no Reshape op)."""
    kernel_shape = tuple(kernel.shape)
    if transpose_kernel:
        inner, outer = kernel_shape[len(kernel_shape) - contracted:], kernel_shape[
            :len(kernel_shape) - contracted]
    else:
        inner, outer = kernel_shape[:contracted], kernel_shape[contracted:]
    k, m = int(np.prod(inner)), int(np.prod(outer))
    shape = (m, k) if transpose_kernel else (k, m)
    matrix = kernel if kernel_shape == shape else keras.ops.reshape(kernel, shape)
    if rows_given:
        return matmul_2d(x, matrix, transpose_b=transpose_kernel)
    lead = tuple(keras.ops.shape(x))[:len(x.shape) - contracted]
    rows = keras.ops.reshape(x, (-1, k))
    return keras.ops.reshape(matmul_2d(rows, matrix, transpose_b=transpose_kernel),
                             lead + outer)


def _check_positive(**values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
