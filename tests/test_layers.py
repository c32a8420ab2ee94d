"""The shared building blocks: attention paths, sharing plans, heads, config round trips."""
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_bertfam.layers import (
    MaskedLMHead,
    MultiHeadSelfAttention,
    TextEmbedding,
    TransformerBlock,
    TransformerStack,
    gather_positions,
    sharing_plan,
)
from keras_bertfam.layers.utils import TruncatedNormal
from tests.conftest import to_numpy

pytestmark = pytest.mark.multibackend


def _x(b=2, t=5, h=8, seed=0):
    return np.random.RandomState(seed).randn(b, t, h).astype("float32")


def test_fused_and_explicit_attention_agree():
    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    x = _x()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    fused = to_numpy(layer(x, padding_mask=mask))
    explicit, probs = layer(x, padding_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(fused, to_numpy(explicit), atol=1e-5)
    probs = to_numpy(probs)
    assert probs.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.all(probs[0, :, :, 3:] < 1e-6)  # padded keys get no attention


def test_head_mask_zeroes_a_head():
    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    x = _x()
    out, probs = layer(x, head_mask=np.array([1.0, 0.0]), return_attention_scores=True)
    assert np.all(to_numpy(probs)[:, 1] == 0)
    # With head 1 removed, the output is the output projection of head 0 alone.
    v = to_numpy(layer.value_dense(x))[:, :, 0]  # (B, T, Hd)
    ctx0 = np.einsum("bts,bsh->bth", to_numpy(probs)[:, 0], v)
    w = to_numpy(layer.output_dense.kernel)[0]  # (Hd, H)
    expected = ctx0 @ w + to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_bad_head_count():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadSelfAttention(num_heads=3, hidden_dim=8)


def test_sharing_plan_follows_albert_grouping():
    assert sharing_plan(12, 1, "all") == ([0] * 12, [0] * 12)
    att, ffn = sharing_plan(6, 3, "attention")
    assert att == [0, 0, 1, 1, 2, 2] and ffn == list(range(6))
    assert sharing_plan(4, 4, "none") == (list(range(4)), list(range(4)))
    with pytest.raises(ValueError, match="share"):
        sharing_plan(4, 1, "heads")
    with pytest.raises(ValueError, match="num_groups"):
        sharing_plan(4, 5, "all")


@pytest.mark.parametrize("share", ["none", "all", "attention", "ffn"])
def test_encoder_shares_weights_once(share):
    enc = TransformerStack(4, 8, 2, 16, share=share, num_groups=1 if share != "none" else None)
    enc(_x(t=3))
    per_attention = 4 * (8 * 8 + 8) + 2 * 8  # q, k, v, output projections + LayerNorm
    per_ffn = 8 * 16 + 16 + 16 * 8 + 8 + 2 * 8  # two Dense + LayerNorm
    n_attention = 1 if share in ("all", "attention") else 4
    n_ffn = 1 if share in ("all", "ffn") else 4
    distinct = {id(w): w for w in enc.weights}.values()
    assert sum(int(np.prod(w.shape)) for w in distinct) == n_attention * per_attention + n_ffn * per_ffn


def test_block_matches_manual_post_ln():
    block = TransformerBlock(hidden_dim=8, num_heads=2, intermediate_dim=16)
    x = _x()
    y = to_numpy(block(x))
    attn = block.attention
    h = to_numpy(attn.layer_norm(x + to_numpy(attn.attention(x))))
    ffn = block.feedforward
    inner = to_numpy(keras.activations.gelu(ffn.intermediate_dense(h), approximate=False))
    expected = to_numpy(ffn.layer_norm(h + to_numpy(ffn.output_dense(inner))))
    np.testing.assert_allclose(y, expected, atol=1e-5)


def test_embedding_projection_and_offset():
    emb = TextEmbedding(50, 10, embedding_dim=4, hidden_dim=8, num_segments=0, position_offset=2)
    out = emb(np.array([[1, 2, 3]]))
    assert tuple(out.shape) == (1, 3, 8)
    assert emb.segment_embedding is None
    assert tuple(emb.position_embedding.embeddings.shape) == (12, 4)
    config = emb.get_config()
    again = TextEmbedding.from_config(config)
    assert again.get_config() == config


def test_mlm_head_gathers_then_projects_on_tied_table():
    emb = keras.layers.Embedding(20, 8)
    emb.build((None,))
    head = MaskedLMHead(token_embedding=emb, intermediate_activation="gelu")
    seq = _x(t=6)
    positions = np.array([[1, 4], [0, 5]])
    logits = to_numpy(head(seq, positions))
    assert logits.shape == (2, 2, 20)
    gathered = to_numpy(gather_positions(seq, positions))
    np.testing.assert_allclose(gathered[1, 1], seq[1, 5])
    h = to_numpy(head.layer_norm(head.dense(gathered)))
    expected = h @ to_numpy(emb.embeddings).T + to_numpy(head.bias)
    np.testing.assert_allclose(logits, expected, atol=1e-5)


# === Weight initialization: BERT's truncated normal, drawn on the host ===
def test_truncated_normal_has_keras_distribution_and_the_same_draw_on_every_backend():
    """kb's `TruncatedNormal` (every backbone's and head's kernels): Keras' distribution (a
    normal cut at 2σ: std 0.8796σ), the same values at every call for an integer seed, and the
    same values on TensorFlow, JAX and torch (the draw is NumPy's: the first values below are
    this test's on every backend)."""
    draw = to_numpy(TruncatedNormal(stddev=0.02, seed=7)((400, 300)))
    assert draw.dtype == np.float32 and draw.shape == (400, 300)
    assert np.abs(draw).max() <= 0.04 and np.abs(draw).max() > 0.039
    assert abs(draw.mean()) < 1e-4
    np.testing.assert_allclose(draw.std(), 0.8796 * 0.02, rtol=0.01)
    theirs = to_numpy(keras.initializers.TruncatedNormal(stddev=0.02, seed=7)((400, 300)))
    np.testing.assert_allclose(draw.std(), theirs.std(), rtol=0.01)
    np.testing.assert_array_equal(draw, to_numpy(TruncatedNormal(stddev=0.02, seed=7)((400, 300))))
    np.testing.assert_allclose(draw[0, :3], [0.0304394, -0.0228821, 0.0230032], atol=1e-6)

    mean = to_numpy(TruncatedNormal(mean=1.0, stddev=0.5, seed=1)((1000,), dtype="bfloat16"))
    assert str(mean.dtype) == "bfloat16"
    assert 0.0 <= mean.astype("float32").min() and mean.astype("float32").max() <= 2.0
    # A SeedGenerator seed: Keras' own draw (a new one at every call).
    seeded = TruncatedNormal(stddev=0.02, seed=keras.random.SeedGenerator(3))
    assert not np.array_equal(to_numpy(seeded((5, 5))), to_numpy(seeded((5, 5))))


def test_truncated_normal_finds_the_values_to_redraw_without_a_float_copy():
    """The values beyond 2 are found with two boolean masks, not `np.abs`'s float32 copy of all
    of them: the most host memory (Python's tracemalloc, which sees NumPy's buffers) a draw of N
    float32 values holds at once is its 4N bytes, 2N of masks and, on TensorFlow and torch, the
    tensor's 4N (measured 6.0N on JAX, 8.0N on TensorFlow and torch; 9.0N with the copy). The
    copy's fresh pages cost ~0.1 s of CPU on a base-size embedding, ~0.35 s the first time."""
    import tracemalloc

    n = 1000 * 500
    tracemalloc.start()
    try:
        draw = TruncatedNormal(stddev=0.02, seed=7)((1000, 500))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8.5 * n, peak / n
    assert np.abs(to_numpy(draw)).max() <= 0.04

def test_set_random_seed_fixes_a_backbones_initial_weights():
    """Unseeded initializers take their seeds from Python's `random`: after
    `keras.utils.set_random_seed` the same weights, and no two kernels alike."""
    import keras_bertfam as kb

    config = dict(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                  intermediate_dim=16, max_sequence_length=12)
    built = []
    for _ in range(2):
        keras.utils.set_random_seed(3)
        built.append({w.path: to_numpy(w) for w in kb.models.BertBackbone(**config).weights})
    for path, value in built[0].items():
        np.testing.assert_array_equal(value, built[1][path], err_msg=path)
    drawn = [v for p, v in built[0].items() if "kernel" in p or "embeddings" in p]
    assert len(drawn) >= 9 and len({v.tobytes() for v in drawn}) == len(drawn)
    assert isinstance(TruncatedNormal.from_config(TruncatedNormal(stddev=0.1).get_config()),
                      TruncatedNormal)
    assert isinstance(keras.initializers.deserialize(keras.initializers.serialize(
        TruncatedNormal(stddev=0.1))), TruncatedNormal)


def _value_and_grad(fn, x):
    """fn(x) and d sum(fn(x)) / dx as NumPy, through the backend's own autodiff."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return to_numpy(y), to_numpy(tape.gradient(y, x))
    if backend == "jax":
        import jax

        y, vjp = jax.vjp(fn, x)
        return to_numpy(y), to_numpy(vjp(np.ones_like(x))[0])
    import torch

    x = torch.tensor(x, requires_grad=True)
    y = fn(x)
    y.sum().backward()
    return to_numpy(y.detach()), to_numpy(x.grad)


def _gelu_and_slope_float64(x, approximate):
    """gelu(x) and gelu'(x) in float64 (the forms' own formulas)."""
    from math import erfc, exp, pi, sqrt, tanh

    if approximate:
        c = sqrt(2 / pi)
        t = np.vectorize(tanh)(c * (x + 0.044715 * x ** 3))
        return (0.5 * x * (1 + t),
                0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c * (1 + 3 * 0.044715 * x ** 2))
    cdf = 0.5 * np.vectorize(erfc)(-x / sqrt(2))
    return x * cdf, cdf + x * np.vectorize(exp)(-x ** 2 / 2) / sqrt(2 * pi)


@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelus_and_their_gradients_on_every_backend(approximate):
    """BERT's erf GELU and the tanh one (ALBERT's gelu_new): the output is Keras' own, bit for
    bit; the gradient (written out on TensorFlow, autodiff elsewhere) against float64."""
    from keras_bertfam.layers.encoder import get_activation

    gelu = get_activation("gelu_approximate" if approximate else "gelu")
    x = np.concatenate([np.linspace(-12, 12, 481), np.random.RandomState(0).randn(499) * 3])
    x = x.astype("float32").reshape(2, -1)
    y, grad = _value_and_grad(gelu, x)
    np.testing.assert_array_equal(y, to_numpy(keras.activations.gelu(x, approximate=approximate)))
    expected = _gelu_and_slope_float64(x.astype("float64"), approximate)[1]
    # float32 tanh is exactly -1 below x ~ -4.5, where the true slope is still ~-4e-6. JAX's
    # gradient is XLA's autodiff of Keras' formula: with XLA's CPU optimizations off (make test's
    # JAX flags), its tanh stops a few ulps short of -1 for x in ~[-7.7, -5], so 1 - t^2 is ~4e-7
    # instead of 0, times a slope factor ~24 there: up to ~9e-6 (not our code; TF's is ours).
    atol = 2e-6 if not approximate else 2e-5 if keras.backend.backend() == "jax" else 5e-6
    np.testing.assert_allclose(grad, expected, rtol=0, atol=atol)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's autodiff of tf.nn.gelu is what keeps the extra tensors")
@pytest.mark.parametrize("activation", ["gelu", "gelu_approximate"])
def test_gelus_keep_only_their_input_for_the_backward_pass(activation):
    """Autodiff through `0.5 * x * (1 + erf(x / √2))` kept x / √2, 0.5 * x and 1 + erf(...)
    (the tanh form more) from the forward pass to the backward one: activations of the
    feed-forward's size, per layer (~0.6 GB of a BERT-base MLM step's peak at 16 x 128).
    Measured as the memory a tape holds after the forward pass (tensors of 64 MB: the
    allocator returns them to the system when freed)."""
    import tensorflow as tf

    from keras_bertfam.layers.encoder import get_activation

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x = tf.random.normal([1024, 16384])  # 64 MB
    size = 1024 * 16384 * 4
    held = []
    # The least of up to three: the process's other threads (a tf.data pipeline an earlier test
    # in this worker left prefetching) can allocate during one measurement (a 3-worker run saw
    # 3.0). The first one under the bound decides (the least is then under it too): each
    # measurement is a forward and backward pass over 16M values (~1.3 s of CPU).
    for _ in range(3):
        before = resident()
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = get_activation(activation)(x)  # the output itself: one tensor of x's size
            held.append(resident() - before)
        grad = tape.gradient(y, x)
        del tape, y
        if held[-1] < 1.6 * size:
            break
    assert min(held) < 1.6 * size, (
        f"the forward pass holds {min(held) / size:.1f} tensors of x's size (least of "
        f"{[round(h / size, 1) for h in held]})")
    assert grad.shape == x.shape


def _outputs_and_grads(fn, inputs, upstream):
    """fn(*inputs) and the gradient of sum(fn(*inputs) * upstream) with respect to every input,
    as float32 NumPy, through the backend's own autodiff. On JAX fn is compiled as one program
    (`jit`; ~2 compilations instead of one per op and shape when run op by op)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        inputs = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            y = fn(*inputs)
            loss = tf.reduce_sum(tf.cast(y, "float32") * upstream)
        grads = tape.gradient(loss, inputs)
    elif backend == "jax":
        import jax

        y, vjp = jax.vjp(jax.jit(fn), *inputs)
        grads = vjp(ops.cast(upstream, y.dtype))
    else:
        import torch

        inputs = [torch.tensor(x, requires_grad=True) for x in inputs]
        y = fn(*inputs)
        (y.float() * torch.tensor(upstream)).sum().backward()
        y, grads = y.detach(), [x.grad for x in inputs]
    return [to_numpy(ops.cast(t, "float32")) for t in [y, *grads]]


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_dropout_attention_context_is_einsum_of_dropout(policy, seeded):
    """`dropout_attention_context` (the attention layers' training path) against plain autodiff through
    `einsum(dropout(softmax(scores)), v)` with the same seed: the same output and gradients
    (scores, with masked keys whose probabilities are exactly 0, and v). Bit for bit on TensorFlow
    and torch, in float32 and mixed precision; on JAX within the matmuls' rounding (its plain
    forward, evaluated inside its JVP, already differs from the undifferentiated one by as much)."""
    from keras_bertfam.layers.attention import dropout_attention_context

    rng = np.random.RandomState(0)
    b, n, t, h = 2, 3, 8, 4
    scores = (3 * rng.randn(b, n, t, t)).astype("float32")
    scores[..., -2:] = -1e9  # masked keys: probabilities exactly 0
    v = rng.randn(b, t, n, h).astype("float32")
    upstream = rng.randn(b, t, n, h).astype("float32")

    def run(ours):
        keras.utils.set_random_seed(7)  # the same unseeded draws (torch's global generator)
        layer = keras.layers.Dropout(0.3, seed=11 if seeded else None, dtype=policy)

        def fn(s, v):
            probs = ops.softmax(ops.cast(s, layer.compute_dtype), axis=-1)
            v = ops.cast(v, layer.compute_dtype)
            if ours:
                return dropout_attention_context(probs, v, layer)
            return ops.einsum("bnts,bsnh->btnh", layer(probs, training=True), v)

        return _outputs_and_grads(fn, [scores, v], upstream)

    plain, ours = run(False), run(True)
    exact = keras.backend.backend() != "jax"
    eps = {"float32": 2.0 ** -23, "mixed_float16": 2.0 ** -10, "mixed_bfloat16": 2.0 ** -7}[policy]
    for name, want, got in zip(["output", "d scores", "d v"], plain, ours):
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=8 * eps * np.abs(want).max(),
                                       err_msg=name)
    # Dropout ran: the output is not the undropped one.
    e = np.exp(scores - scores.max(-1, keepdims=True))
    undropped = np.einsum("bnts,bsnh->btnh", e / e.sum(-1, keepdims=True), v)
    assert np.abs(plain[0] - undropped).max() > 0.1


def _backward_ops(upstream):
    """A TensorFlow graph's backward pass: the ops downstream of the `upstream` gradient
    placeholder (control edges included: e.g. a gradient op under a control dependency)."""
    backward, todo = set(), [upstream.op]
    while todo:
        op = todo.pop()
        if op not in backward:
            backward.add(op)
            todo.extend(c for out in op.outputs for c in out.consumers())
            todo.extend(op._control_outputs)
    return backward


def _prob_sized_tensors_kept(fn, x, shape):
    """The tensors of `shape` that fn's backward pass reads from its forward pass, as sorted
    (dtype, description) pairs: in TensorFlow's graph (the gradient's ops: those downstream of
    the upstream gradient), JAX's saved residuals, torch's saved tensors (distinct storages)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def grad(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            return tape.gradient(y, x, output_gradients=upstream)

        graph = grad.get_concrete_function(tf.TensorSpec(x.shape), tf.TensorSpec(x.shape)).graph
        backward = _backward_ops(graph.inputs[1])
        return sorted({(t.dtype.name, t.name) for op in backward for t in op.inputs
                       if t.op not in backward and tuple(t.shape) == shape})
    if backend == "jax":
        try:
            from jax._src.ad_checkpoint import saved_residuals
        except ImportError:
            pytest.skip("jax's saved_residuals moved")
        return sorted((str(aval.dtype), why) for aval, why in saved_residuals(fn, x)
                      if tuple(aval.shape) == shape)
    import torch

    saved = {}

    def pack(t):
        if tuple(t.shape) == shape:
            saved[t.untyped_storage().data_ptr()] = str(t.dtype).replace("torch.", "")
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(torch.tensor(x, requires_grad=True))
    return sorted((dtype, str(ptr)) for ptr, dtype in saved.items())


def test_attention_training_keeps_no_dropped_probabilities():
    """In training with attention dropout, the backward pass reads the softmax's probabilities
    and a bool mask from the forward pass, not the dropped probabilities too (a float tensor of
    their size per layer, 12.6 MB at BERT-base 16 x 128): on TensorFlow and torch one float
    tensor of that size is kept (the probabilities, which softmax's gradient keeps anyway), on
    JAX nothing of dropout's. The explicit path with returned scores (plain autodiff) keeps the
    dropped probabilities: the check sees them."""
    b, t, hidden, heads = 2, 5, 12, 3
    shape = (b, heads, t, t)
    layer = MultiHeadSelfAttention(heads, hidden, attention_dropout=0.3)
    layer.build((b, t, hidden))
    x = _x(b, t, hidden)

    def ours(x):
        return layer(x, training=True)

    def plain(x):
        return layer(x, training=True, return_attention_scores=True)[0]

    kept, kept_plain = (_prob_sized_tensors_kept(f, x, shape) for f in (ours, plain))
    floats = [k for k in kept if k[0] != "bool"]
    floats_plain = [k for k in kept_plain if k[0] != "bool"]
    if keras.backend.backend() == "jax":
        assert not [k for k in floats if "dropout" in k[1]], kept
        assert [k for k in floats_plain if "dropout" in k[1]], kept_plain
        assert len(floats) < len(floats_plain), (kept, kept_plain)
    else:
        assert len(floats) == 1, kept
        assert len(floats_plain) >= 2, kept_plain


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_attention_training_path_equals_the_plain_one(policy):
    """MultiHeadSelfAttention in training (dropout_attention_context) against its explicit path with the
    scores returned (plain autodiff through Keras' dropout), the same draws: the same outputs and
    gradients with respect to the input, bit for bit on TensorFlow and torch, within rounding on
    JAX."""
    b, t, hidden, heads = 2, 6, 12, 3
    layer = MultiHeadSelfAttention(heads, hidden, attention_dropout=0.3, dtype=policy)
    layer.build((b, t, hidden))
    state = to_numpy(layer.dropout_layer.seed_generator.state)
    x = _x(b, t, hidden)
    upstream = _x(b, t, hidden, seed=1)
    mask = np.ones((b, t), "int32")
    mask[1, -2:] = 0

    def run(ours):
        keras.utils.set_random_seed(3)
        layer.dropout_layer.seed_generator.state.assign(state)

        def fn(x):
            if ours:
                return layer(x, padding_mask=mask, training=True)
            return layer(x, padding_mask=mask, training=True, return_attention_scores=True)[0]

        return _outputs_and_grads(fn, [x], upstream)

    plain, ours = run(False), run(True)
    assert not np.array_equal(plain[0], to_numpy(ops.cast(layer(x, padding_mask=mask), "float32")))
    if keras.backend.backend() != "jax":
        for want, got in zip(plain, ours):
            np.testing.assert_array_equal(got, want)
    else:
        eps = 2.0 ** -23 if policy == "float32" else 2.0 ** -7
        for want, got in zip(plain, ours):
            np.testing.assert_allclose(got, want, rtol=0, atol=16 * eps * np.abs(want).max())


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's transformations")
def test_attention_dropout_gradient_under_jit_and_checkpoint():
    """The gradient of an attention layer in training with attention dropout (its custom
    gradient, `dropout_attention_context`) through `jax.grad(jax.jit(f))`, `jax.jit(jax.grad(f))`
    and `jax.grad(jax.checkpoint(f))` (what `keras.RematScope` applies): the op-by-op
    `jax.grad(f)`'s, within rounding, the same draws. The first and the last traced the custom
    gradient's forward again after the call, which read a tensor of the call the call had
    dropped (IndexError)."""
    import jax

    b, t, hidden = 2, 5, 8
    layer = MultiHeadSelfAttention(2, hidden, attention_dropout=0.3)
    layer.build((b, t, hidden))
    state = to_numpy(layer.dropout_layer.seed_generator.state)
    x, upstream = _x(b, t, hidden), _x(b, t, hidden, seed=1)

    def loss(x):
        return ops.sum(layer(x, training=True) * upstream)

    def gradient(transform):
        layer.dropout_layer.seed_generator.state.assign(state)
        return np.asarray(transform(loss)(x))

    want = gradient(jax.grad)
    undropped = jax.grad(lambda x: ops.sum(layer(x) * upstream))(x)
    assert np.abs(want - np.asarray(undropped)).max() > 0.1 * np.abs(want).max()  # dropout ran
    for name, transform in [("grad(jit)", lambda f: jax.grad(jax.jit(f))),
                            ("jit(grad)", lambda f: jax.jit(jax.grad(f))),
                            ("grad(checkpoint)", lambda f: jax.grad(jax.checkpoint(f)))]:
        np.testing.assert_allclose(gradient(transform), want, rtol=0,
                                   atol=16 * 2.0 ** -23 * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_layer_norm_keeping_input_is_keras_layer_norm(policy):
    """`layer_norm_keeping_input` (every LayerNorm of the library on TensorFlow) against Keras'
    `ops.layer_normalization`: the same output bit for bit (Keras' ops in Keras' order), and the
    gradients with respect to x, gamma and beta of plain autodiff within float32 rounding, on
    every backend (rows of very different scales and offsets; one constant row, whose
    normalized values are 0; not on torch, see below). The layer is Keras' layer with the same
    weights and outputs."""
    from keras_bertfam.layers.normalization import LayerNormalization, layer_norm_keeping_input

    rng = np.random.RandomState(0)
    b, t, h = 2, 5, 16
    # Offsets small against the rows' spread: x - mean is exact enough for both ways to agree
    # (with an offset 1e5 times a row's spread the centred values themselves are rounding).
    x = (rng.randn(b, t, h) * rng.choice([0.5, 1.0, 30.0], (b, t, 1))
         + rng.choice([0.0, 2.0, -10.0], (b, t, 1))).astype("float32")
    torch = keras.backend.backend() == "torch"
    if not torch:
        # A constant row (1/σ = 1e6): Keras' formula, x·(γ/σ) + (β - μ·γ/σ), rounds at 2.5e5
        # there; torch's ops.layer_normalization (F.layer_norm) centres first.
        x[1, 2] = 0.25
    gamma = (1 + 0.3 * rng.randn(h)).astype("float32")
    beta = (0.2 * rng.randn(h)).astype("float32")
    upstream = rng.randn(b, t, h).astype("float32")
    compute = keras.mixed_precision.DTypePolicy(policy).compute_dtype
    epsilon = 1e-12

    def run(ours):
        def fn(x, gamma, beta):
            x = ops.cast(x, compute)
            if ours:
                return layer_norm_keeping_input(x, gamma, beta, epsilon)
            return ops.layer_normalization(x, gamma, beta, axis=-1, epsilon=epsilon)

        return _outputs_and_grads(fn, [x, gamma, beta], upstream)

    plain, ours = run(False), run(True)
    if torch:  # the reference is F.layer_norm's kernel (centred first), not Keras' formula,
        # which loses digits to x·γ/σ and μ·γ/σ cancelling in rows offset from 0
        np.testing.assert_allclose(ours[0], plain[0], rtol=0, atol=1e-4 * np.abs(plain[0]).max())
    else:
        np.testing.assert_array_equal(ours[0], plain[0], err_msg="output")
    for name, want, got in zip(["d x", "d gamma", "d beta"], plain[1:], ours[1:]):
        # (torch: against its kernel's own backward, which rounds differently: ~2e-5 seen)
        np.testing.assert_allclose(got, want, rtol=0, atol=(5e-5 if torch else 1e-5)
                                   * np.abs(want).max(), err_msg=name)

    layer = LayerNormalization(epsilon=epsilon, dtype=policy)
    reference = keras.layers.LayerNormalization(epsilon=epsilon, dtype=policy)
    for norm in (layer, reference):
        norm.build((b, t, h))
        norm.set_weights([gamma, beta])
    np.testing.assert_array_equal(to_numpy(ops.cast(layer(ops.cast(x, compute)), "float32")),
                                  to_numpy(ops.cast(reference(ops.cast(x, compute)), "float32")))
    assert LayerNormalization.from_config(layer.get_config()).epsilon == epsilon


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's autodiff of Keras' LayerNorm is what keeps the extra "
                           "tensor (torch's layer_norm keeps x and the statistics)")
def test_layer_norm_keeps_only_its_input_for_the_backward_pass():
    """Autodiff through Keras' LayerNorm keeps x and `rsqrt(var + ε) * gamma` from the forward
    pass to the backward one; ours keeps x (and (..., 1) statistics): one tensor of x's size less
    per LayerNorm (6 MB at BERT-base 16 x 128, 25 LayerNorms a step). The centred input
    `x - mean` is computed in the backward pass, not kept in x's place (in float32 the same
    size; in mixed precision twice x's)."""
    from keras_bertfam.layers.normalization import LayerNormalization

    shape = (2, 5, 16)
    x = _x(*shape)
    kept = []
    for cls in (LayerNormalization, keras.layers.LayerNormalization):
        norm = cls(epsilon=1e-12)
        norm.build(shape)
        kept.append(_prob_sized_tensors_kept(norm, x, shape))
    ours, plain = kept
    # x itself (in mixed precision its float16, not a float32 centred copy)
    assert [name for _, name in ours] == ["x:0"], ours
    assert len(plain) == 2, plain


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_tied_logits_is_matmul_with_the_transposed_table(policy):
    """`tied_logits` (the MLM heads' projection onto the tied embedding table) against plain
    autodiff through `matmul(x, transpose(table))`: the same logits bit for bit, gradients
    within the matmuls' rounding (the table's is `g^T x` in its own layout on TensorFlow)."""
    from keras_bertfam.layers.heads import tied_logits

    rng = np.random.RandomState(0)
    x, table = rng.randn(2, 3, 8).astype("float32"), rng.randn(50, 8).astype("float32")
    upstream = rng.randn(2, 3, 50).astype("float32")
    compute = keras.mixed_precision.DTypePolicy(policy).compute_dtype

    def run(ours):
        def fn(x, table):
            x, table = ops.cast(x, compute), ops.cast(table, compute)
            return tied_logits(x, table) if ours else ops.matmul(x, ops.transpose(table))

        return _outputs_and_grads(fn, [x, table], upstream)

    plain, ours = run(False), run(True)
    np.testing.assert_array_equal(ours[0], plain[0])
    eps = 2.0 ** -23 if policy == "float32" else 2.0 ** -10
    for name, want, got in zip(["d x", "d table"], plain[1:], ours[1:]):
        np.testing.assert_allclose(got, want, rtol=0, atol=16 * eps * np.abs(want).max(),
                                   err_msg=name)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's autodiff transposes the table's gradient")
def test_tied_logits_backward_makes_no_transposed_table_gradient():
    """Autodiff of `matmul(x, transpose(table))` builds the table's gradient as (E, V) and
    transposes it (two tensors of the table's size at once, 89 MB each at BERT-base); ours
    computes it as (V, E): no op of the backward pass outputs an (E, V) tensor."""
    import tensorflow as tf

    from keras_bertfam.layers.heads import tied_logits

    x, table = tf.TensorSpec((2, 3, 8)), tf.TensorSpec((50, 8))

    def transposed_gradients(fn):
        @tf.function
        def grad(x, table):
            with tf.GradientTape() as tape:
                tape.watch(table)
                y = fn(x, table)
            return tape.gradient(y, table)

        graph = grad.get_concrete_function(x, table).graph
        return [op.name for op in graph.get_operations() if "gradient_tape" in op.name
                or op.type == "MatMul"
                for t in op.outputs if tuple(t.shape) == (8, 50)]

    assert transposed_gradients(lambda x, t: ops.matmul(x, ops.transpose(t)))
    assert not transposed_gradients(tied_logits)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelu_and_slope_share_one_formula_with_keras_gelu(approximate, dtype):
    """`_gelu_and_slope` (the GELUs' written-out gradients), with or without the [1] zero the
    feed-forward's backward pass threads through it: its gelu(x) is `tf.nn.gelu`'s formula op
    for op, the bits of Keras' GELU on TensorFlow; on every backend gelu(x) and the slope are
    float64's within the dtype's rounding. (Torch's own erf GELU, `0.5·x·(1 + erf(x/√2))`, loses
    the digits of 1 + erf for negative x: 2e-3 of gelu(-3.3) in float32, 0 below -5.9: not
    compared here.)"""
    from keras_bertfam.layers.encoder import _gelu_and_slope, _gelu_and_slope_of

    x = np.concatenate([np.linspace(-12, 12, 481), np.random.RandomState(0).randn(499) * 3])
    x = ops.cast(x.astype("float32").reshape(2, -1), dtype)
    x64 = to_numpy(ops.cast(x, "float32")).astype("float64")
    y64, slope64 = _gelu_and_slope_float64(x64, approximate)
    eps = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    keras_gelu = to_numpy(ops.cast(keras.activations.gelu(x, approximate=approximate), "float32"))
    for zero in (0.0, ops.zeros((1,), dtype)):
        y, slope = (to_numpy(ops.cast(t, "float32")) for t in _gelu_and_slope(x, approximate, zero))
        if keras.backend.backend() == "tensorflow":
            np.testing.assert_array_equal(y, keras_gelu)
        # (atol: for negative x both forms round gelu(x) ~ 0 with no relative accuracy, as
        # Keras' do: 1 + tanh(u) cancels, float16's subnormals)
        np.testing.assert_allclose(y, y64, rtol=8 * eps, atol=8 * eps)
        # (float32 tanh is exactly -1 below x ~ -4.5, where the tanh form's slope is ~-4e-6;
        # the slope's second term multiplies tanh's rounding by |x|·c·(1 + 3k·x²), ~47 at
        # x = -7.3: XLA's tanh under the tests' XLA flags is a few ulps off -1 there)
        scale = 1.0
        if approximate:
            scale = 1.0 + np.abs(x64) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x64 ** 2)
        error = np.abs(slope - slope64)
        assert np.all(error <= max(8 * eps, 5e-6) * scale), (error / scale).max()
    if dtype != "float32":
        # `_gelu_and_slope_of` (what the written-out gradients run): a 16-bit x's gelu(x) and
        # slope computed in float32, each rounded once to x's dtype (on TensorFlow its gelu(x)
        # Keras' float32 GELU, rounded)
        keras_gelu = to_numpy(ops.cast(ops.cast(keras.activations.gelu(
            ops.cast(x, "float32"), approximate=approximate), dtype), "float32"))
        for zero in (0.0, ops.zeros((1,), dtype)):
            y, slope = (to_numpy(ops.cast(t, "float32"))
                        for t in _gelu_and_slope_of(x, approximate, zero))
            if keras.backend.backend() == "tensorflow":
                np.testing.assert_array_equal(y, keras_gelu)
            # one rounding to the dtype, on top of float32's (the tanh form's float32 tanh is
            # -1 below x ~ -4.5: gelu(x) 0 instead of ~-1e-7, the slope as above)
            tiny = 1e-6 if approximate else 2.0 ** -24
            np.testing.assert_allclose(y, y64, rtol=eps, atol=tiny)
            assert np.all(np.abs(slope - slope64) <= eps * np.abs(slope64) + 5 * tiny * scale)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelu_dense_keeping_input_is_gelu_then_dense(approximate, policy):
    """`gelu_dense_keeping_input` (the feed-forward's second half on TensorFlow) against plain
    autodiff through Keras' GELU (of a 16-bit x: in float32, rounded once to x's dtype) and
    `matmul(·, kernel) + bias` (Keras' Dense's call): the same output bit for bit, the gradients
    with respect to x, the kernel and the bias within the compute dtype's rounding (float32: 1e-6
    of the largest), on every backend."""
    from keras_bertfam.layers.encoder import gelu_dense_keeping_input

    rng = np.random.RandomState(0)
    b, t, f, h = 2, 5, 24, 8
    x = (2 * rng.randn(b, t, f)).astype("float32")
    kernel = (0.3 * rng.randn(f, h)).astype("float32")
    bias = rng.randn(h).astype("float32")
    upstream = rng.randn(b, t, h).astype("float32")
    compute = keras.mixed_precision.DTypePolicy(policy).compute_dtype

    def run(ours):
        def fn(x, kernel, bias):
            x, kernel, bias = (ops.cast(v, compute) for v in (x, kernel, bias))
            if ours:
                return gelu_dense_keeping_input(x, kernel, bias, approximate)
            y = _keras_gelu_rounded_once(x, approximate)
            return ops.add(ops.matmul(y, kernel), bias)

        return _outputs_and_grads(fn, [x, kernel, bias], upstream)

    plain, ours = run(False), run(True)
    np.testing.assert_array_equal(ours[0], plain[0], err_msg="output")
    eps = {"float32": 2.0 ** -23, "mixed_float16": 2.0 ** -10, "mixed_bfloat16": 2.0 ** -7}[policy]
    for name, want, got in zip(["d x", "d kernel", "d bias"], plain[1:], ours[1:]):
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * eps * np.abs(want).max(),
                                   err_msg=name)


def _keras_gelu_rounded_once(x, approximate):
    """Keras' GELU of x; of a float16 / bfloat16 x computed in float32 and rounded once (what
    our GELUs on TensorFlow compute: TF's 16-bit Erfc is a slow scalar loop on CPU)."""
    if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16"):
        y = keras.activations.gelu(ops.cast(x, "float32"), approximate=approximate)
        return ops.cast(y, x.dtype)
    return keras.activations.gelu(x, approximate=approximate)


def _feedforward_pair(activation, policy, seed=0):
    """A FeedForwardSublayer and a reference one computing `output(act(intermediate(h)))` with
    Keras' own layers and activation (plain autodiff), the same weights."""
    from keras_bertfam.layers.encoder import FeedForwardSublayer

    # (on TensorFlow ours compute a 16-bit input's GELU in float32; elsewhere Keras' own)
    gelu = (_keras_gelu_rounded_once if keras.backend.backend() == "tensorflow"
            else lambda x, approximate: keras.activations.gelu(x, approximate=approximate))
    keras_activation = {
        "gelu": lambda x: gelu(x, False),
        "gelu_approximate": lambda x: gelu(x, True),
    }.get(activation, activation)
    layers = [FeedForwardSublayer(8, 24, activation=a, dtype=policy)
              for a in (activation, keras_activation)]
    rng = np.random.RandomState(seed)
    for layer in layers:
        layer.build((2, 5, 8))
    weights = [(0.5 * rng.randn(*w.shape)).astype("float32") for w in layers[0].weights]
    for layer in layers:
        layer.set_weights(weights)
    return layers


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_approximate"])
def test_feedforward_gelu_path_is_keras_dense_gelu_dense(activation, policy, monkeypatch):
    """The feed-forward sublayer with the GELU (on TensorFlow `gelu_dense_keeping_input`, on
    JAX and torch the layers' own calls) against Keras' Dense, GELU, Dense (and the same
    LayerNorm; on TensorFlow a 16-bit input's GELU in float32, rounded once): the same output bit
    for bit; the gradients with respect to the input and every
    weight (both kernels, both biases, the LayerNorm's) within the compute dtype's rounding."""
    from keras_bertfam.layers import encoder

    calls = []
    fused = encoder.gelu_dense_keeping_input
    monkeypatch.setattr(encoder, "gelu_dense_keeping_input",
                        lambda *args: calls.append(1) or fused(*args))
    ours, reference = _feedforward_pair(activation, policy)
    compute = ours.compute_dtype
    rng = np.random.RandomState(1)
    x, upstream = rng.randn(2, 5, 8).astype("float32"), rng.randn(2, 5, 8).astype("float32")
    values = [to_numpy(w) for w in ours.trainable_variables]

    def run(layer):
        def fn(x, *weights):
            outputs, _ = layer.stateless_call(weights, [], ops.cast(x, compute), training=True)
            return outputs

        return _outputs_and_grads(fn, [x, *values], upstream)

    plain, got = run(reference), run(ours)
    assert len(calls) == (1 if keras.backend.backend() == "tensorflow" else 0)
    np.testing.assert_array_equal(got[0], plain[0], err_msg="output")
    eps = {"float32": 2.0 ** -23, "mixed_float16": 2.0 ** -10, "mixed_bfloat16": 2.0 ** -7}[policy]
    names = ["d x"] + [w.path for w in ours.trainable_variables]
    for name, want, have in zip(names, plain[1:], got[1:]):
        np.testing.assert_allclose(have, want, rtol=0, atol=8 * eps * np.abs(want).max(),
                                   err_msg=name)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's autodiff is what keeps the GELU's output")
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_feedforward_keeps_the_gelus_input_not_its_output(policy, monkeypatch):
    """A train step's gradient of the feed-forward sublayer (the input and every weight) reads
    one tensor of the intermediate size from the forward pass: the GELU's input x (its
    derivative and gelu(x) are computed from x in the backward pass). The plain path (the
    GELU's written-out gradient, then Keras' Dense) keeps two: the GELU's derivative and its
    output gelu(x), for the output kernel's gradient (24 MB each a layer at BERT-base)."""
    import tensorflow as tf

    from keras_bertfam.layers import encoder

    def kept(layer):
        x = tf.TensorSpec((2, 5, 8))

        @tf.function
        def grad(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
            return tape.gradient(y, [x, *layer.trainable_variables], output_gradients=upstream)

        graph = grad.get_concrete_function(x, tf.TensorSpec((2, 5, 8), layer.compute_dtype)).graph
        backward = _backward_ops(graph.inputs[1])

        def buffer(t):  # the tensor whose buffer a Reshape chain shares
            while t.op.type in ("Reshape", "Identity"):
                t = t.op.inputs[0]
            return t

        return sorted({buffer(t).name for op in backward for t in op.inputs
                       if t.op not in backward and t.shape.num_elements() == 2 * 5 * 24})

    layer, _ = _feedforward_pair("gelu", policy)
    ours = kept(layer)
    assert len(ours) == 1 and "intermediate" in ours[0], ours  # x: the intermediate Dense's
    monkeypatch.setattr(encoder, "_is_plain_dense", lambda dense, x: False)
    plain = kept(_feedforward_pair("gelu", policy)[0])
    assert len(plain) == 2, plain


@pytest.mark.parametrize("fallback", ["relu", "lora", "int8"])
def test_feedforward_falls_back_to_keras_layers(fallback, monkeypatch):
    """Another activation than the GELU, a LoRA-enabled or a quantized output Dense: the
    feed-forward is the layers' own calls (no written-out path), Keras' numbers bit for bit."""
    from keras_bertfam.layers import encoder

    calls = []
    monkeypatch.setattr(encoder, "gelu_dense_keeping_input", lambda *args: calls.append(1))
    layer, _ = _feedforward_pair("relu" if fallback == "relu" else "gelu", "float32")
    dense = layer.output_dense
    if fallback == "lora":
        dense.enable_lora(2)
        dense.lora_kernel_b.assign(np.random.RandomState(2).randn(2, 8).astype("float32"))
    elif fallback == "int8":
        dense.quantize("int8")
    x = ops.convert_to_tensor(_x(2, 5, 8))
    expected = to_numpy(layer.layer_norm(
        x + dense(layer.activation(layer.intermediate_dense(x)))))
    np.testing.assert_array_equal(to_numpy(layer(x)), expected)
    assert not calls
    if fallback == "lora":  # the LoRA update is not 0: the check above sees it
        plain = ops.add(ops.matmul(layer.activation(layer.intermediate_dense(x)),
                                   dense._kernel), dense.bias)
        assert not np.allclose(to_numpy(layer.layer_norm(x + plain)), expected)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("equation", ["btd,dnh->btnh", "btnh,nhd->btd"])
def test_heads_dense_is_einsum_dense(equation, policy):
    """`HeadsDense` (the attention's projections as one 2-D matmul of the rows) against Keras'
    `EinsumDense` with the same weights: outputs and the gradients of the input, kernel and
    bias within the matmuls' rounding, in float32 and under mixed_bfloat16; with LoRA enabled
    it is EinsumDense's own path."""
    from keras_bertfam.layers.attention import HeadsDense

    rng = np.random.RandomState(1)
    into_heads = equation.startswith("btd")
    x_shape, out = ((3, 5, 8), (None, 2, 4)) if into_heads else ((3, 5, 2, 4), (None, 8))
    bias_axes = "nh" if into_heads else "d"
    layers = [cls(equation, output_shape=out, bias_axes=bias_axes, dtype=policy)
              for cls in (HeadsDense, keras.layers.EinsumDense)]
    for layer in layers:
        layer.build(x_shape)
    for w, v in zip(layers[0].weights, layers[1].weights):
        v.assign(rng.randn(*w.shape).astype("float32"))
        w.assign(to_numpy(v))
    x = rng.randn(*x_shape).astype("float32")
    upstream = rng.randn(*((3, 5, 2, 4) if into_heads else (3, 5, 8))).astype("float32")
    compute = layers[0].compute_dtype

    def run(layer):
        return _outputs_and_grads(lambda x: layer(ops.cast(x, compute)), [x], upstream)

    ours, keras_layer = run(layers[0]), run(layers[1])
    eps = 2.0 ** -23 if policy == "float32" else 2.0 ** -7
    for got, want in zip(ours, keras_layer):
        np.testing.assert_allclose(got, want, rtol=0, atol=32 * eps * np.abs(want).max())
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        def weight_grads(layer):
            with tf.GradientTape() as tape:
                y = layer(ops.cast(x, compute))
                loss = tf.reduce_sum(tf.cast(y, "float32") * upstream)
            return [to_numpy(g) for g in tape.gradient(loss, layer.trainable_variables)]

        for got, want in zip(weight_grads(layers[0]), weight_grads(layers[1])):
            np.testing.assert_allclose(got, want, rtol=0, atol=32 * eps * np.abs(want).max())
    layers[0].enable_lora(2)
    layers[0].lora_kernel_b.assign(rng.randn(*layers[0].lora_kernel_b.shape).astype("float32"))
    lora = to_numpy(layers[0](ops.cast(x, compute)))
    assert not np.allclose(lora, ours[0], atol=1e-2)  # the LoRA term is there


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="how Keras' TensorFlow einsum lowers a static-length projection")
def test_attention_projections_run_as_2d_matmuls():
    """With a static sequence length Keras' TensorFlow einsum computes "btd,dnh->btnh" as a
    batch matmul broadcasting the kernel, whose kernel gradient is one product per example
    summed over the batch; the attention's projections are one MatMul each, forward and
    backward (the train step of MiniLM at 32 x 16: 1.13 -> 0.60 s, float32)."""
    import tensorflow as tf

    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    x = tf.constant(_x(b=3))
    layer(x)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x)
        return tape.gradient(y, layer.trainable_variables)

    ops_ = step.get_concrete_function(x).graph.get_operations()
    projections = ("query", "key", "value", "attention_output")
    batched = [op.name for op in ops_ if op.type in ("BatchMatMulV2", "Einsum")
               and any(p in op.name for p in projections)]
    assert not batched
    # forward and d kernel of the four, d input of the output projection (x is a constant)
    assert [op.type for op in ops_].count("MatMul") == 4 + 4 + 1


def _traced_ops(fn, *specs):
    """The ops of `fn`'s forward and backward graph, traced for `specs` (unknown batch and
    length, as a `fit` with dynamic padding traces its step)."""
    import tensorflow as tf

    return tf.function(fn).get_concrete_function(*specs).graph.get_operations()


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="a property of the TensorFlow train step's graph")
def test_attention_reads_its_inputs_shape_once_and_adds_biases_to_rows():
    """Issue #15 / #13: the train step's graph at unknown batch and length. The query, key and
    value projections take x's rows from one Reshape and read x's shape once (each of the
    four projections read it and flattened x for itself: 4 Shape ops); each bias is added to the
    (B·T, N·Hd) product as a vector (BiasAdd, its gradient one BiasAddGrad) rather than to the
    4-D output (a broadcast AddV2: the gradient's Shape / BroadcastGradientArgs / Sum / Reshape).
    Same numbers: `test_heads_dense_is_einsum_dense` and the HF parity tests."""
    import tensorflow as tf

    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    layer.build((None, None, 8))
    spec = tf.TensorSpec((None, None, 8))

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, padding_mask=tf.ones(tf.shape(x)[:2]))
        return tape.gradient(y, [x] + layer.trainable_variables)

    graph_ops = _traced_ops(step, spec)
    kinds = [op.type for op in graph_ops]
    assert kinds.count("BiasAdd") == 4 and kinds.count("BiasAddGrad") == 4, kinds
    projections = ("query", "key", "value", "attention_output")
    in_projections = [op for op in graph_ops if any(f"/{p}/" in op.name for p in projections)]
    # x's shape read once, by the attention layer itself (the backward pass's Reshape
    # gradients read their inputs' shapes); no bias added by broadcasting
    assert not [op.name for op in in_projections
                if op.type == "Shape" and not op.name.startswith("gradient_tape")]
    assert not [op.name for op in in_projections if op.type == "BroadcastGradientArgs"]
    assert kinds.count("MatMul") == 4 + 4 + 4  # forward, d kernel, d rows of each projection


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="a property of the TensorFlow train step's graph")
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_feedforward_runs_on_rows(activation):
    """The feed-forward sublayer computes on its input's rows (B·T, H): its Dense layers are
    plain MatMuls, not TensorFlow's tensordot of a 3-D input at an unknown length (Shape,
    GatherV2, Prod, ConcatV2, Transpose ... each way: ~20 ops a Dense), and its input's shape is
    read once, for the reshape back. The output is the 3-D layers' bit for bit
    (`test_feedforward_gelu_path_is_keras_dense_gelu_dense`, the parity tests)."""
    import tensorflow as tf

    from keras_bertfam.layers.encoder import FeedForwardSublayer

    layer = FeedForwardSublayer(8, 24, activation=activation, dropout=0.1)
    layer.build((None, None, 8))

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
        return tape.gradient(y, [x] + layer.trainable_variables)

    kinds = [op.type for op in _traced_ops(step, tf.TensorSpec((None, None, 8)))]
    assert "Prod" not in kinds and "GatherV2" not in kinds and "ConcatV2" not in kinds, kinds
    assert kinds.count("MatMul") == 2 * 3  # forward, d kernel, d input of the two Dense
    x = _x(2, 5, 8)
    rows = layer(ops.reshape(ops.convert_to_tensor(x), (10, 8)))
    np.testing.assert_array_equal(to_numpy(layer(x)), to_numpy(ops.reshape(rows, (2, 5, 8))))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="a property of the TensorFlow train step's graph")
def test_stack_makes_the_attention_mask_once():
    """The (B, 1, 1, T) boolean key mask of the padding mask is made once for every layer of a
    stack (it was cast and reshaped in each layer); the outputs are those of the blocks called
    one by one with the (B, T) padding mask."""
    import tensorflow as tf

    stack = TransformerStack(3, 8, 2, 16)
    stack.build((None, None, 8))

    def forward(x, mask):
        return stack(x, padding_mask=mask)

    graph_ops = _traced_ops(forward, tf.TensorSpec((None, None, 8)),
                            tf.TensorSpec((None, None), tf.int32))
    to_bool = [op.name for op in graph_ops if op.type == "Cast" and op.outputs[0].dtype == tf.bool]
    assert len(to_bool) == 1, to_bool
    x, mask = _x(2, 5, 8), np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "int32")
    expected = ops.convert_to_tensor(x)
    for block in stack.blocks:
        expected = block(expected, padding_mask=mask)
    np.testing.assert_array_equal(to_numpy(stack(x, padding_mask=mask)), to_numpy(expected))


def test_heads_dense_with_a_bias_over_some_output_axes():
    """A HeadsDense whose bias covers only the head width (bias_axes="h") broadcasts it over
    the heads, as EinsumDense does (the rows path adds a bias over every output axis as a
    vector, this one after the reshape)."""
    from keras_bertfam.layers.attention import HeadsDense

    layers = [cls("btd,dnh->btnh", output_shape=(None, 2, 4), bias_axes="h")
              for cls in (HeadsDense, keras.layers.EinsumDense)]
    rng = np.random.RandomState(0)
    for layer in layers:
        layer.build((3, 5, 8))
    for w, v in zip(layers[0].weights, layers[1].weights):
        v.assign(rng.randn(*w.shape).astype("float32"))
        w.assign(to_numpy(v))
    x = rng.randn(3, 5, 8).astype("float32")
    np.testing.assert_allclose(to_numpy(layers[0](x)), to_numpy(layers[1](x)), rtol=1e-5,
                               atol=1e-5)
