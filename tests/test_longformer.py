"""Longformer: HF parity (backbone and the four task heads, both ways), banded attention (no T x T
tensor), all-global = full attention, from_roberta, bad input, XLA, presets."""
import inspect
import os
import re
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from keras_bertfam.layers.longformer_attention import LongformerSelfAttention
from keras_bertfam.presets.families import longformer as longformer_family
from tests.conftest import to_numpy

TINY = dict(vocabulary_size=120, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
            attention_window=[4, 8], max_sequence_length=64)


def _hf_config(**overrides):
    import transformers

    cfg = dict(vocab_size=120, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=66, type_vocab_size=1,
               layer_norm_eps=1e-5, pad_token_id=1, sep_token_id=2, attention_window=[4, 8])
    cfg.update(overrides)
    return transformers.LongformerConfig(**cfg)


def _inputs(length, batch=3, seed=0, global_tokens=True):
    """Right-padded inputs (<s>=0 first, <pad>=1 after the text); global on <s> and a few more."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 120, (batch, length)).astype("int32")
    ids[:, 0] = 0
    mask = np.ones_like(ids)
    mask[1, length // 2:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 1
    glob = np.zeros_like(ids)
    if global_tokens:
        glob[:, 0] = 1
        glob[0, 5] = glob[0, length - 1] = 1
        glob[1, 2] = 1
        glob[2, length - 1] = 1  # on padding: stays padding
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask,
            "global_attention_mask": glob}


def _hf_run(model, x, **kwargs):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(x["padding_mask"]), **kwargs)


def _max_diff(ours, theirs, mask):
    return np.abs(to_numpy(ours) - theirs)[mask.astype(bool)].max()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("hf_longformer"))
    transformers.LongformerModel(_hf_config()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def parity_models(hf_dir):
    """Ours converted from `hf_dir` and HF's model read from it, once for the parity cases (each
    only calls them)."""
    import transformers

    return (kb.models.LongformerBackbone.from_preset(hf_dir),
            transformers.LongformerModel.from_pretrained(hf_dir).eval())


@pytest.fixture(scope="module")
def tiny():
    """`LongformerBackbone(**TINY)` as a test's first build makes it (seed 1234), once for the
    tests that only call, trace, save or export it."""
    keras.utils.set_random_seed(1234)
    return kb.models.LongformerBackbone(**TINY)


@pytest.mark.multibackend
@pytest.mark.parametrize("length", [16, 13, 24, 7])  # multiples of the windows and not
@pytest.mark.parametrize("global_tokens", [False, True])
def test_parity_with_random_hf_longformer(parity_models, length, global_tokens):
    ours, hf = parity_models
    assert ours.layer_windows == [4, 8] and ours.max_sequence_length == 64
    x = _inputs(length, global_tokens=global_tokens)
    import torch

    ref = _hf_run(hf, x, global_attention_mask=torch.tensor(x["global_attention_mask"]))
    got = ours(x)
    assert _max_diff(got["sequence_output"], ref.last_hidden_state.numpy(),
                     x["padding_mask"]) <= 1e-4
    assert np.abs(to_numpy(got["pooled_output"]) - ref.pooler_output.numpy()).max() <= 1e-4
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


def test_global_tokens_change_the_output(parity_models):
    ours = parity_models[0]  # converted from hf_dir
    with_global = to_numpy(ours(_inputs(24))["sequence_output"])
    without = to_numpy(ours(_inputs(24, global_tokens=False))["sequence_output"])
    assert np.abs(with_global - without)[0].max() > 1e-3


def test_export_to_transformers_round_trip(tmp_path, tiny):
    import torch
    import transformers

    ours = tiny
    kb.presets.export_to_transformers(ours, str(tmp_path))
    hf = transformers.LongformerModel.from_pretrained(str(tmp_path)).eval()
    assert hf.config.attention_window == [4, 8]
    x = _inputs(13)
    ref = _hf_run(hf, x, global_attention_mask=torch.tensor(x["global_attention_mask"]))
    assert _max_diff(ours(x)["sequence_output"], ref.last_hidden_state.numpy(),
                     x["padding_mask"]) <= 1e-4


# === Task heads, both ways ===
def _qa_inputs(length=20, batch=2):
    """`<s> q q q </s></s> c ... </s> <pad>`: segment 0 = `<s>` + question + its `</s>`."""
    rng = np.random.RandomState(3)
    ids = rng.randint(3, 120, (batch, length)).astype("int32")
    segments = np.ones_like(ids)
    mask = np.ones_like(ids)
    for row, q in enumerate((3, 5)):
        ids[row, 0] = 0
        ids[row, q + 1] = ids[row, q + 2] = 2
        segments[row, : q + 2] = 0
        end = length - 2 * row
        ids[row, end - 1] = 2
        mask[row, end:] = 0
        ids[row, end:] = 1
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


HEADS = [
    ("MaskedLM", "LongformerForMaskedLM", {}),
    ("TextClassifier", "LongformerForSequenceClassification", {"num_classes": 3}),
    ("TokenClassifier", "LongformerForTokenClassification", {"num_classes": 4}),
    ("QuestionAnswerer", "LongformerForQuestionAnswering", {}),
]


@pytest.mark.multibackend
@pytest.mark.parametrize("task_name,hf_class,kwargs", HEADS)
def test_task_heads_convert_both_ways(tmp_path, task_name, hf_class, kwargs):
    """HF's own default global attention (<s> for classification, the question for QA) against
    our tasks': same logits; then our task exported and read back by HF."""
    import torch
    import transformers

    torch.manual_seed(1)
    config = _hf_config(num_labels=kwargs.get("num_classes", 2))
    hf = getattr(transformers, hf_class)(config).eval()
    hf.save_pretrained(str(tmp_path / "hf"))
    task_cls = getattr(kb.tasks, task_name)
    task = kb.presets.convert_task(str(tmp_path / "hf"), task_cls, preprocessor=None, **kwargs)
    x = _qa_inputs()
    feed = {k: v for k, v in x.items() if k in task.input}
    positions = np.tile(np.arange(x["token_ids"].shape[1], dtype="int32"), (2, 1))
    if task_name == "MaskedLM":
        feed["mask_positions"] = positions

    got = task(feed)  # once: the export below leaves the task as it is

    def compare(model):
        ref = _hf_run(model, x)
        valid = x["padding_mask"].astype(bool)
        if task_name == "QuestionAnswerer":
            for ours_key, theirs in (("start_logits", ref.start_logits),
                                     ("end_logits", ref.end_logits)):
                assert _max_diff(got[ours_key], theirs.numpy(), valid) <= 1e-4
        elif task_name == "TextClassifier":
            assert np.abs(to_numpy(got) - ref.logits.numpy()).max() <= 1e-4
        else:
            assert _max_diff(got, ref.logits.numpy(), valid) <= 1e-4

    compare(hf)
    kb.presets.export_to_transformers(task, str(tmp_path / "back"))
    back = getattr(transformers, hf_class).from_pretrained(str(tmp_path / "back")).eval()
    compare(back)


def test_task_global_attention():
    from keras_bertfam.models.longformer import global_attention_for_task

    x = _qa_inputs()
    qa = to_numpy(global_attention_for_task(x, "QuestionAnswerer"))
    np.testing.assert_array_equal(qa[0, :6], [1, 1, 1, 1, 0, 0])  # <s> q q q, not </s></s>
    np.testing.assert_array_equal(qa[1, :8], [1] * 6 + [0, 0])
    assert qa[:, 8:].sum() == 0
    cls = to_numpy(global_attention_for_task(x, "TextClassifier"))
    assert cls[:, 0].tolist() == [1, 1] and cls[:, 1:].sum() == 0
    assert to_numpy(global_attention_for_task(x, "MaskedLM")).sum() == 0
    # the same rule in TensorFlow's ops, as the tasks' tf.data check counts it
    from keras_bertfam.preprocessing.global_attention import TF_OPS

    for task in ("QuestionAnswerer", "MultipleChoice", "TextClassifier", "MaskedLM"):
        np.testing.assert_array_equal(global_attention_for_task(x, task, xp=TF_OPS).numpy(),
                                      to_numpy(global_attention_for_task(x, task)))


# === Attention: banded, all-global = full, from_roberta ===
def _layer_inputs(length, window, global_tokens, seed=0):
    """(4, T, 16) activations and the merged (4, T) mask: row 0 full with global tokens at 0 and
    5, row 1 right-padded (global at 0), row 2 two real tokens (later windows all padding), row 3
    only padding."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(4, length, 16)).astype("float32")
    mask = np.ones((4, length), "int32")
    mask[1, length // 2:] = 0
    mask[2, 2:] = 0
    mask[3] = 0
    if global_tokens:
        mask[0, [0, 5]] = mask[1, 0] = 2
    return x, mask


def _outputs_and_grads(layer, x, mask, calls, ran):
    """For each `(kwargs, with_grads)` of `calls`, the layer's output and the gradients of
    sum(output * c) (a fixed random c) with respect to x and every weight, on the current backend
    (with_grads=False: the output alone, gradients None), and a copy of `ran` after that call.
    JAX: every call in one jit-compiled function (eager JAX dispatches op by op, slowly; a
    function per call compiled the forward pass once per call)."""
    weights = layer.trainable_variables
    cotangent = np.random.RandomState(1).normal(size=x.shape).astype("float32")
    backend = keras.backend.backend()

    def output(x, kwargs, values=None):
        if values is None:
            out = layer(x, padding_mask=mask, **kwargs)
        else:
            out, _ = layer.stateless_call(values, [], x, padding_mask=mask, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def one_call(x, kwargs, with_grads):
        if not with_grads:
            return output(x, kwargs), None
        if backend == "tensorflow":
            import tensorflow as tf

            x = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = output(x, kwargs)
                loss = tf.reduce_sum(out * cotangent)
            return out, tape.gradient(loss, [x] + weights)
        import torch

        x = torch.tensor(x, requires_grad=True)
        for w in weights:
            w.value.grad = None
        out = output(x, kwargs)
        (out * torch.tensor(cotangent)).sum().backward()
        return out, [x.grad] + [w.value.grad for w in weights]

    if backend == "jax":
        import jax

        snapshots = []  # `ran` after each call, as the function is traced

        def every_call(x, values):
            done = []
            for kwargs, with_grads in calls:
                if not with_grads:
                    done.append((output(x, kwargs, values), None))
                    snapshots.append(list(ran))
                    continue

                def loss(x, values, kwargs=kwargs):
                    out = output(x, kwargs, values)
                    return (out * cotangent).sum(), out

                (_, out), (gx, gw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
                    x, values)
                done.append((out, [gx] + list(gw)))
                snapshots.append(list(ran))
            return done

        results = [(out, grads, seen) for (out, grads), seen in
                   zip(jax.jit(every_call)(x, [w.value for w in weights]), snapshots)]
    else:
        results = []
        for kwargs, with_grads in calls:
            out, grads = one_call(x, kwargs, with_grads)
            results.append((out, grads, list(ran)))
    # with no global token, the global projections' gradients are None on TF and torch
    return [(to_numpy(out), None if grads is None else
             [np.zeros(w.shape) if g is None else to_numpy(g) for w, g in zip([x] + weights, grads)],
             seen) for out, grads, seen in results]


@pytest.mark.multibackend
@pytest.mark.parametrize("length,window", [(12, 6), (13, 6), (10, 8)])
@pytest.mark.parametrize("global_tokens", [False, True])
def test_fused_attention_equals_explicit(length, window, global_tokens, monkeypatch):
    """The fused path (dot_product_attention, taken when nothing needs the probabilities) and
    the explicit one (taken for dropout, head_mask, scores) agree in outputs and gradients, with
    and without global tokens, T a multiple of w/2 or not, padding queries (an all-padding row
    too): never NaN."""
    keras.utils.set_random_seed(0)
    layer = LongformerSelfAttention(num_heads=2, hidden_dim=16, attention_window=window)
    x, mask = _layer_inputs(length, window, global_tokens)
    # built, not called: the same weights, without an eager call (on JAX, every op compiled for
    # an output nothing checks)
    layer.build(x.shape)
    ran = []
    for path in ("_window_fused", "_window_explicit"):
        original = getattr(LongformerSelfAttention, path)
        monkeypatch.setattr(LongformerSelfAttention, path,
                            lambda self, *a, _f=original, _p=path: ran.append(_p) or _f(self, *a))
    (fused, fused_grads, ran_fused), (explicit, explicit_grads, _), (scored, _, ran_all) = \
        _outputs_and_grads(layer, x, mask, [({}, True),
                                            ({"head_mask": np.ones(2, "float32")}, True),
                                            ({"return_attention_scores": True}, False)], ran)
    assert set(ran_fused) == {"_window_fused"}
    assert "_window_explicit" in ran_all
    # x and every kernel and bias but the keys' (softmax ignores a shift shared by a row)
    assert sum(np.abs(g).max() > 1e-4 for g in fused_grads) == 8 + 5 * global_tokens
    assert np.isfinite(fused).all() and all(np.isfinite(g).all() for g in fused_grads)
    np.testing.assert_allclose(fused, explicit, atol=1e-5, rtol=0)
    np.testing.assert_allclose(scored, explicit, atol=1e-5, rtol=0)
    for got, expected in zip(fused_grads, explicit_grads):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # padding queries: the output bias alone, as HF's zeroed rows
    bias = to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(fused[3], np.broadcast_to(bias, fused[3].shape), atol=1e-6)


def _shapes_of_every_tensor(layer, x, mask, **kwargs):
    """The shapes of every intermediate tensor of one call: a TF graph's op outputs, a jaxpr's
    variables (sub-jaxprs too) or the inputs of every op torch ran."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        graph = tf.function(lambda x, m: layer(x, padding_mask=m, **kwargs)).get_concrete_function(
            tf.constant(x), tf.constant(mask)).graph
        return [tuple(t.shape) for op in graph.get_operations() for t in op.outputs
                if t.shape.rank is not None]
    if backend == "jax":
        import jax

        values = [w.value for w in layer.trainable_variables]
        jaxpr = jax.make_jaxpr(lambda x, m: layer.stateless_call(
            values, [], x, padding_mask=m, **kwargs)[0])(x, mask)
        shapes = []

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                shapes.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
                for param in eqn.params.values():
                    for sub in param if isinstance(param, (list, tuple)) else [param]:
                        inner = getattr(sub, "jaxpr", sub)
                        if hasattr(inner, "eqns"):
                            walk(inner)

        walk(jaxpr.jaxpr)
        return shapes
    import torch
    from torch.profiler import profile

    x = torch.tensor(x, requires_grad=True)
    with profile(record_shapes=True) as prof:
        out = layer(x, padding_mask=torch.tensor(mask), **kwargs)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    names = {event.name for event in prof.events()}
    if not kwargs:  # the fused path ran torch's SDPA
        assert "aten::scaled_dot_product_attention" in names
    return [tuple(s) for event in prof.events() for s in event.input_shapes if s]


@pytest.mark.multibackend
@pytest.mark.parametrize("explicit", [False, True])
def test_attention_is_banded_no_full_matrix(explicit):
    """No tensor of one call (the fused path and the explicit one; on torch, forward and
    backward) holds a (T, T) pair of axes: memory is O(T·(w + G))."""
    length = 96
    layer = LongformerSelfAttention(num_heads=2, hidden_dim=16, attention_window=8,
                                    max_global_tokens=4)  # traced: G = 4 static slots
    x = np.zeros((1, length, 16), "float32")
    mask = np.ones((1, length), "int32")
    mask[0, 0] = 2
    kwargs = {"head_mask": np.ones(2, "float32")} if explicit else {}
    layer.build(x.shape)
    shapes = _shapes_of_every_tensor(layer, x, mask, **kwargs)
    assert shapes
    assert not [s for s in shapes if list(s).count(length) >= 2]
    biggest = max(int(np.prod([d or 1 for d in s])) for s in shapes)
    assert biggest < length * length * 2  # 2 heads x T x T would be a full score matrix


@pytest.mark.multibackend
def test_all_global_equals_full_attention_and_from_roberta(tmp_path):
    roberta = kb.models.RobertaBackbone(120, 2, 2, 16, 32, max_sequence_length=20)
    longformer = kb.models.LongformerBackbone.from_roberta(roberta, max_sequence_length=64,
                                                           attention_window=4)
    table = to_numpy(longformer.embeddings.position_embedding.embeddings)
    learned = to_numpy(roberta.embeddings.position_embedding.embeddings)[2:]
    np.testing.assert_array_equal(table[2:22], learned)
    np.testing.assert_array_equal(table[22:42], learned)  # copied again, as the paper
    attn = longformer.blocks[0].attention.attention
    np.testing.assert_array_equal(to_numpy(attn.key_global_dense.kernel),
                                  to_numpy(attn.key_dense.kernel))
    x = _inputs(18, global_tokens=False)
    full = to_numpy(roberta({k: x[k] for k in roberta.input})["sequence_output"])
    valid = x["padding_mask"].astype(bool)
    # every token global: each attends to all, through the (copied) global projections
    everything = dict(x, global_attention_mask=np.ones_like(x["token_ids"]))
    assert _max_diff(longformer(everything)["sequence_output"], full, valid) <= 1e-5
    # a window covering the sequence is full attention too (no global token)
    wide = kb.models.LongformerBackbone.from_roberta(roberta, max_sequence_length=64,
                                                     attention_window=36)
    assert _max_diff(wide(x)["sequence_output"], full, valid) <= 1e-5
    # a narrow window is not
    assert _max_diff(longformer(x)["sequence_output"], full, valid) > 1e-3


def test_from_roberta_reads_a_preset_dir_and_refuses_fewer_positions(tmp_path):
    """`from_roberta(preset_or_dir)`: a saved RoBERTa preset dir gives the same Longformer as the
    backbone object; a max_sequence_length under RoBERTa's positions is refused."""
    keras.utils.set_random_seed(0)
    roberta = kb.models.RobertaBackbone(120, 2, 2, 16, 32, max_sequence_length=20)
    roberta.save_to_preset(str(tmp_path / "roberta"))
    from_object = kb.models.LongformerBackbone.from_roberta(roberta, max_sequence_length=64,
                                                            attention_window=4)
    from_dir = kb.models.LongformerBackbone.from_roberta(str(tmp_path / "roberta"),
                                                         max_sequence_length=64,
                                                         attention_window=4)
    x = _inputs(18)
    np.testing.assert_allclose(to_numpy(from_dir(x)["sequence_output"]),
                               to_numpy(from_object(x)["sequence_output"]), atol=1e-6)
    with pytest.raises(ValueError, match="max_sequence_length=16 is shorter than the RoBERTa"):
        kb.models.LongformerBackbone.from_roberta(roberta, max_sequence_length=16,
                                                  attention_window=4)


@pytest.mark.multibackend
def test_xla_compiled_equals_eager():
    """Traced with static shapes (the global slots are max_global_tokens), jit-compiled."""
    backbone = kb.models.LongformerBackbone(**dict(TINY, max_global_tokens=6))
    x = _inputs(13)
    eager = to_numpy(backbone(x)["sequence_output"])
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(lambda x: backbone(x, training=False), jit_compile=True)
        got = compiled({k: tf.constant(v) for k, v in x.items()})
    elif backend == "jax":
        import jax

        compiled = jax.jit(lambda x: backbone.stateless_call(
            [v.value for v in backbone.trainable_variables],
            [v.value for v in backbone.non_trainable_variables], x)[0])
        got = compiled(x)
    else:
        pytest.skip("XLA via TensorFlow or JAX")
    valid = x["padding_mask"].astype(bool)
    assert _max_diff(got["sequence_output"], eager, valid) <= 1e-5


@pytest.mark.multibackend
def test_empty_batch_and_a_missing_global_mask(tiny):
    """A batch of no rows gives outputs of no rows, eagerly on both attention paths (fused;
    explicit through `inspect`) and traced for an unknown batch size (the reshapes named every
    size: -1 cannot be inferred for no elements; the global-slot count took the max of nothing).
    Without `global_attention_mask` the backbone runs with none, as HF's LongformerModel does."""
    backbone = tiny
    x = _inputs(13)
    empty = {k: v[:0] for k, v in x.items()}
    assert tuple(backbone(empty)["sequence_output"].shape) == (0, 13, 16)
    inspected = backbone.inspect(empty)
    assert [tuple(p.shape) for p in inspected["attention_probs"]] == [(0, 2, 13, 5), (0, 2, 13, 9)]
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        spec = {k: tf.TensorSpec([None, None], tf.int32) for k in x}
        traced = tf.function(lambda x: backbone(x)["sequence_output"], input_signature=[spec])
        assert tuple(traced(empty).shape) == (0, 13, 16)
        assert tuple(traced(x).shape) == (3, 13, 16)
    elif backend == "jax":
        import jax

        traced = jax.jit(lambda x: backbone.stateless_call(
            [v.value for v in backbone.trainable_variables],
            [v.value for v in backbone.non_trainable_variables], x)[0]["sequence_output"])
        assert tuple(traced(empty).shape) == (0, 13, 16)
    no_global = dict(x, global_attention_mask=np.zeros_like(x["token_ids"]))
    without = {k: v for k, v in x.items() if k != "global_attention_mask"}
    np.testing.assert_array_equal(to_numpy(backbone(without)["sequence_output"]),
                                  to_numpy(backbone(no_global)["sequence_output"]))


def test_inspect_returns_windowed_probabilities(tiny):
    backbone = tiny
    x = _inputs(16)
    out = backbone.inspect(x)
    probs = [to_numpy(p) for p in out["attention_probs"]]
    # G = 3 global columns (row 0 has three), then w + 1 window columns
    assert probs[0].shape == (3, 2, 16, 3 + 5) and probs[1].shape == (3, 2, 16, 3 + 9)
    real = x["padding_mask"].astype(bool)
    np.testing.assert_allclose(probs[0].sum(-1)[:, 0][real], 1.0, atol=1e-5)
    assert len(out["hidden_states"]) == 3


# === Bad input ===
def test_bad_windows_name_the_layer():
    with pytest.raises(ValueError, match="attention_window of layer 1 .* got 5"):
        kb.models.LongformerBackbone(**dict(TINY, attention_window=[4, 5]))
    with pytest.raises(ValueError, match="attention_window of layer 0 .* got 0"):
        kb.models.LongformerBackbone(**dict(TINY, attention_window=[0, 4]))
    with pytest.raises(ValueError, match="attention_window must be a positive even"):
        kb.models.LongformerBackbone(**dict(TINY, attention_window=-2))
    with pytest.raises(ValueError, match="3 entries for num_layers=2"):
        kb.models.LongformerBackbone(**dict(TINY, attention_window=[4, 4, 4]))


@pytest.fixture(scope="module")
def capped():
    """`LongformerBackbone(**TINY, max_global_tokens=2)` (seed 1234), once for the tests of
    inputs it refuses or answers with NaN."""
    keras.utils.set_random_seed(1234)
    return kb.models.LongformerBackbone(**dict(TINY, max_global_tokens=2))


def test_bad_inputs(capped):
    backbone = capped
    x = _inputs(16, global_tokens=False)
    with pytest.raises(ValueError, match="same .batch, length. shape"):
        backbone(dict(x, global_attention_mask=np.zeros((3, 15), "int32")))
    long = _inputs(70, global_tokens=False)
    with pytest.raises(ValueError, match="70 tokens.*max_sequence_length=64"):
        backbone(long)
    many = dict(x, global_attention_mask=np.ones_like(x["token_ids"]))
    with pytest.raises(ValueError, match="global tokens.*max_global_tokens=2"):
        backbone(many)


def _over_the_cap():
    """Inputs whose row 0 has 5 global tokens (rows 1 and 2: <s> only), over `capped`'s 2."""
    x = _inputs(16, global_tokens=False)
    glob = np.zeros_like(x["token_ids"])
    glob[0, :5] = 1
    glob[1:, 0] = 1
    return dict(x, global_attention_mask=glob)


TOO_MANY = "A row has 5 global tokens .*expected at most max_global_tokens=2"


@pytest.mark.multibackend
def test_too_many_global_tokens_raise_or_are_nan_never_a_silent_answer(capped):
    """Model inputs over max_global_tokens given to the backbone directly: eagerly a ValueError
    on every backend; traced on TensorFlow (predict; fit and the SavedModel run the same graph)
    an InvalidArgumentError from the backbone's graph. Under XLA (jax.jit: JAX's predict; TF's
    jit_compile), where nothing can raise, the documented last resort: the overflowing row is
    all NaN and the other rows are exact."""
    backbone, x = capped, _over_the_cap()
    with pytest.raises(ValueError, match=TOO_MANY):
        backbone(x)
    backend = keras.backend.backend()
    if backend == "torch":  # predict runs eagerly: the eager error
        with pytest.raises(ValueError, match=TOO_MANY):
            backbone.predict(x, verbose=0)
        return
    ok = {k: v[1:] for k, v in x.items()}
    exact = to_numpy(backbone(ok)["sequence_output"])
    if backend == "jax":
        out = backbone.predict(x, verbose=0)["sequence_output"]
        assert np.isnan(out[0]).all() and np.isfinite(out[1:]).all()
        np.testing.assert_allclose(out[1:], exact, atol=1e-5)
        return
    import tensorflow as tf

    # (its message as a task's: the Assert's data read as one sentence, `carry_tf_error`)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"A row has 5 global tokens"
                       r".*expected at most max_global_tokens=2"):
        backbone.predict(x, verbose=0)
    compiled = tf.function(lambda x: backbone(x, training=False)["sequence_output"],
                           jit_compile=True)
    out = compiled({k: tf.constant(v) for k, v in x.items()}).numpy()
    assert np.isnan(out[0]).all() and np.isfinite(out[1:]).all()
    np.testing.assert_allclose(out[1:], exact, atol=1e-5)


def _choice_rows():
    """`_qa_inputs`' two rows as one question with two choices, (1, 2, 20): `<s> ctx </s></s>
    choice </s>`, global attention (HF's default) on 14 and 10 tokens."""
    return {k: v[None] for k, v in _qa_inputs().items()}


def _with_cap(task, max_global_tokens):
    """The same task (same weights) on a backbone with another max_global_tokens."""
    backbone = kb.models.LongformerBackbone.from_config(
        dict(task.backbone.get_config(), max_global_tokens=max_global_tokens))
    other = type(task).from_config(dict(task.get_config(), backbone=backbone))
    other.set_weights(task.get_weights())
    return other


@pytest.mark.multibackend
def test_multiple_choice_model_inputs_within_the_cap_equal_hf_and_over_it_raise(tmp_path):
    """HF LongformerForMultipleChoice (no cap) against ours with max_global_tokens exactly the
    longest choice's count: the same logits through predict (traced: the checks in the data and
    in the graph let it through); one slot fewer: refused before the model, naming the count,
    on every backend (fit, predict and a tf.data.Dataset alike), and by the SavedModel."""
    import tensorflow as tf
    import torch
    import transformers

    torch.manual_seed(2)
    hf = transformers.LongformerForMultipleChoice(_hf_config()).eval()
    hf.save_pretrained(str(tmp_path / "hf"))
    task = kb.presets.convert_task(str(tmp_path / "hf"), kb.tasks.MultipleChoice,
                                   preprocessor=None)
    x = _choice_rows()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(x["padding_mask"])).logits.numpy()
    exact = _with_cap(task, 14)
    np.testing.assert_allclose(exact.predict(x, verbose=0), ref, atol=1e-4)

    short = _with_cap(task, 13)
    message = ("Invalid row for MultipleChoice: a row has 14 global tokens, expected at most "
               "max_global_tokens=13 .*each choice and its closing separator: shorter choices")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        short.predict(x, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        short.fit(x, np.zeros((1,), "int32"), verbose=0)
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros((1,), "int32"))).batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        short.evaluate(ds, verbose=0)
    if keras.backend.backend() != "tensorflow":
        return
    # The SavedModel: the task derives the global attention in its graph, which the backbone's
    # check reads (this row gave NaN logits before it).
    kb.export.export_saved_model(short, str(tmp_path / "1"), include_preprocessing=False)
    serve = tf.saved_model.load(str(tmp_path / "1")).signatures["token_ids"]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"\[14\] \[global tokens.*max_global_tokens=13"):
        serve(**{k: tf.constant(v) for k, v in x.items()})
    fits = {k: v[:, 1:] for k, v in x.items()}  # the second choice alone: 10 global tokens
    np.testing.assert_allclose(serve(**{k: tf.constant(v) for k, v in fits.items()})["logits"],
                               ref[:, 1:], atol=1e-4)


@pytest.fixture(scope="module")
def raw_text_multiple_choice(bert_vocab):
    """A one-layer Longformer MultipleChoice on raw (context, choices), WordPiece, at most 4
    global tokens, for the raw-text MC tests (the refusals first; the fit test then trains it)."""
    from keras_bertfam.preprocessing import finetuning as ft

    keras.utils.set_random_seed(1234)
    tok = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    return kb.tasks.MultipleChoice(
        kb.models.LongformerBackbone(tok.vocabulary_size(), 1, 2, 16, 32, attention_window=4,
                                     max_global_tokens=4, max_sequence_length=32),
        preprocessor=ft.MultipleChoicePreprocessor(tok, 24))


@pytest.mark.multibackend
def test_multiple_choice_raw_text_refuses_a_choice_over_the_cap(raw_text_multiple_choice):
    """The raw-text route (the preprocessor packs `[CLS] context [SEP] choice [SEP]`; the task
    puts global attention on the choice) stops at a choice whose global tokens do not fit
    max_global_tokens, naming the count and what to do, in fit (tf.data), predict (in memory)
    and a dataset, on every backend; a choice at the cap passes. Before the check, such a row
    gave a NaN loss and, after one step, NaN weights (TensorFlow's graph and JAX alike)."""
    import tensorflow as tf

    mc = raw_text_multiple_choice
    # global tokens of a choice (WordPiece's one [SEP]: HF's rule skips its first piece and
    # takes the closing [SEP]): 4 for "a very long film", 5 with "boring"
    at_cap = (["a great film", "dull"], [["great", "a very long film"], ["bad", "a film"]])
    assert np.isfinite(mc.predict(at_cap, verbose=0)).all()
    over = (at_cap[0], [["great", "a very long boring film"], ["bad", "a film"]])
    message = ("Invalid row for MultipleChoice: a row has 5 global tokens, expected at most "
               "max_global_tokens=4 .*shorter choices.*larger max_global_tokens")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        mc.fit(over, [0, 0], batch_size=2, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        mc.predict(over, verbose=0)
    ds = tf.data.Dataset.from_tensor_slices(over).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        mc.predict(ds, verbose=0)
    # model inputs a batch at a time (JAX's *_on_batch once skipped the check: NaN weights)
    features = keras.utils.unpack_x_y_sample_weight(mc.preprocessor(over))[0]
    features = {k: np.asarray(v) for k, v in features.items()}
    labels = np.array([0, 0])
    for run in (lambda: mc.train_on_batch(features, labels),
                lambda: mc.test_on_batch(features, labels), lambda: mc.predict_on_batch(features)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            run()
    assert np.isfinite(mc.predict(at_cap, verbose=0)).all()  # no step was taken


def test_question_answerer_refuses_a_question_over_the_cap(bert_vocab):
    """QA's global attention is `<s>` + the question, at most 1 + max_question_length tokens:
    within the default cap (64 + 1 <= 128) it cannot overflow; a preprocessor allowing longer
    questions than the cap is valid, and only a question that overflows is refused, in fit,
    predict and answer()."""
    import tensorflow as tf

    from keras_bertfam.preprocessing import finetuning as ft

    tok = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    qa = kb.tasks.QuestionAnswerer(
        kb.models.LongformerBackbone(tok.vocabulary_size(), 1, 2, 16, 32, attention_window=4,
                                     max_global_tokens=4, max_sequence_length=32),
        preprocessor=ft.QuestionAnswererPreprocessor(tok, 24, stride=8, max_question_length=8))
    context = ["the film was great and long"]
    long = ["was the film very good"]  # [CLS] + 5 tokens
    message = ("Invalid row for QuestionAnswerer: a row has 6 global tokens, expected at most "
               "max_global_tokens=4 .*the question.*max_question_length")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        qa.answer(long, context)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        qa.predict((long, context), verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        qa.fit((long, context), ([4], ["film"]), verbose=0)


# === Config, saving, presets ===
def test_config_round_trip_and_saving(tmp_path, tiny):
    backbone = tiny
    config = backbone.get_config()
    params = set(inspect.signature(kb.models.LongformerBackbone.__init__).parameters) - {
        "self", "kwargs"}
    assert params <= set(config)
    assert kb.models.LongformerBackbone.from_config(config).get_config() == config
    x = _inputs(13)
    path = os.path.join(tmp_path, "b.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)
    backbone.save_to_preset(str(tmp_path / "preset"))
    restored = kb.models.LongformerBackbone.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(to_numpy(restored(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


def _hf_param_count(config):
    import torch
    import transformers

    with torch.device("meta"):
        hf = transformers.LongformerModel(transformers.LongformerConfig(
            vocab_size=config["vocabulary_size"], hidden_size=config["hidden_dim"],
            num_hidden_layers=config["num_layers"], num_attention_heads=config["num_heads"],
            intermediate_size=config["intermediate_dim"],
            max_position_embeddings=config["max_sequence_length"] + 2, type_vocab_size=1,
            attention_window=config["attention_window"]))
    return sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name,millions", [("longformer_base_4096", 149),
                                           ("longformer_large_4096", 435)])
def test_preset_param_counts_equal_hf(name, millions):
    preset = kb.presets.get(name)
    assert kb.presets.count_params(name) == _hf_param_count(preset.config) == preset.params
    assert round(preset.params / 1e6) == millions
    if name == "longformer_base_4096":
        assert preset.params == 148_659_456  # HF's count with the pooler (REFERENCE.md)
    # the analytic count against a built model
    small = dict(preset.config, num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64,
                 vocabulary_size=100, max_sequence_length=64)
    built = kb.models.LongformerBackbone(**small)
    assert built.num_params() == longformer_family.longformer_param_count(small)


# === Tasks on raw strings and their SavedModel export ===
# The export path with a WordPiece tokenizer (the Longformer part of the graph does not depend on
# it); byte-level BPE tokenization, offsets and QA export are tested in test_roberta.py.
@pytest.fixture(scope="module")
def longformer_exports(tmp_path_factory, bert_vocab):
    if keras.backend.backend() != "tensorflow":  # before building: export refuses other backends
        pytest.skip("SavedModel export runs on TensorFlow")
    from keras_bertfam.preprocessing import finetuning as ft
    from tests import test_export as te

    keras.utils.set_random_seed(1)
    tok = te.tokenizer()
    seq = te.SEQ

    # Two layers with their own windows for the MaskedLM (a window per layer, exported); one for
    # the other tasks, whose point is their heads and global attention (each layer is traced
    # twice per export and restored again by the fresh process).
    def backbone(vocab=len(te.VOCAB), attention_window=(4,)):
        return kb.models.LongformerBackbone(vocab, len(attention_window), 2, 16, 32,
                                            attention_window=list(attention_window),
                                            max_global_tokens=24, max_sequence_length=64)

    cases = []
    masked = ["the [MASK] was great", "a [MASK] plot [MASK]", "[MASK]"]
    mlm = kb.tasks.MaskedLM(backbone(attention_window=(4, 6)),
                            preprocessor=kb.preprocessing.MaskedLMPreprocessor(tok, seq))
    cases.append(("masked_lm", mlm, {"text": masked},
                  te.reference(mlm, te.packed(tok, te.with_mask(tok, masked)))))
    clf = kb.tasks.TextClassifier(backbone(), num_classes=3,
                                  preprocessor=ft.TextClassifierPreprocessor(tok, seq))
    ref = te.reference(clf, te.packed(tok, tok(te.TEXT_A)))
    np.testing.assert_allclose(ref["logits"], clf.predict(te.TEXT_A, verbose=0), atol=1e-5)
    cases.append(("text_classifier", clf, {"text": te.TEXT_A}, ref))
    tagger = kb.tasks.TokenClassifier(backbone(), num_classes=4,
                                      preprocessor=ft.TokenClassifierPreprocessor(tok, seq))
    cases.append(("token_classifier", tagger, {"text": te.TEXT_A},
                  te.reference(tagger, te.packed(tok, tok(te.TEXT_A)))))
    real = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    qa = kb.tasks.QuestionAnswerer(
        backbone(real.vocabulary_size()),
        preprocessor=ft.QuestionAnswererPreprocessor(real, 48, stride=16, max_question_length=16))
    f = qa.preprocessor._features([real(te.QA_QUESTIONS), real(te.QA_CONTEXTS)])
    special = {"cls": real.cls_token_id, "sep": real.sep_token_id, "pad": real.pad_token_id,
               "mask": real.mask_token_id}
    ref = te.reference(qa, {k: v.numpy() for k, v in f.items()}, special)
    answers = qa.answer(te.QA_QUESTIONS, te.QA_CONTEXTS)
    ref.update(answer_start=np.array([a["start"] for a in answers], np.int32),
               answer_end=np.array([a["end"] for a in answers], np.int32),
               answer_text=np.array([a["text"].encode() for a in answers], object))
    cases.append(("question_answerer", qa,
                  {"question": te.QA_QUESTIONS, "context": te.QA_CONTEXTS}, ref))

    root = tmp_path_factory.mktemp("longformer_exports")
    done = []
    for name, model, inputs, ref in cases:
        path = str(root / name / "1")
        own = name == "question_answerer"
        signatures = kb.export.export_saved_model(model, path, sequence_length=None if own else seq,
                                                  tokenizer=None if own else tok)
        assert signatures == ["serving_default", "token_ids"]
        done.append((name, path, inputs, ref))
    return done


def test_longformer_task_exports_pass_audit_and_fresh_process(longformer_exports, tmp_path,
                                                               bert_vocab, serving_process):
    import json

    from tests import test_export as te

    jobs = []
    for name, path, inputs, ref in longformer_exports:
        report = kb.export.audit_ops(path, tf_text="2.12.1")
        assert not report["unsupported"], name
        ids = te._ids_for(name, inputs, bert_vocab, None)
        jobs.append({"dir": path, "inputs": inputs, "ids": ids,
                     "out": str(tmp_path / f"{name}.npz")})
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs, default=lambda a: np.asarray(a).tolist()))
    proc = serving_process(te.FRESH, spec)  # a fresh process (conftest)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    for (name, path, inputs, ref), job in zip(longformer_exports, jobs):
        got = np.load(job["out"], allow_pickle=True)
        for key, expected in ref.items():
            if key.startswith("answer_"):
                np.testing.assert_array_equal(got[key], expected, err_msg=f"{name}:{key}")
                continue
            np.testing.assert_allclose(got["ids__" + key], expected, atol=1e-5,
                                       err_msg=f"{name}:token_ids:{key}")
            te.assert_dynamic_padding_equal(name, key, got, ref)


def test_text_classifier_fits_raw_strings_with_global_cls(bert_vocab):
    from keras_bertfam.preprocessing import finetuning as ft

    tok = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    clf = kb.tasks.TextClassifier(
        kb.models.LongformerBackbone(tok.vocabulary_size(), 1, 2, 16, 32, attention_window=4,
                                     max_sequence_length=32),
        num_classes=2, preprocessor=ft.TextClassifierPreprocessor(tok, 24))
    assert "global_attention_mask" not in clf.input
    history = clf.fit(["a great film", "dull and bad", "great", "bad"], [1, 0, 1, 0],
                      batch_size=2, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()



@pytest.mark.multibackend
def test_fit_at_dropout_0_has_a_gradient_for_every_weight():
    """The fused global rows (dropout 0: no probabilities needed) with few global slots
    (G * N < H) dropped q . b_k, the global keys' bias term: one shift per softmax row, so its
    gradient is 0 in exact arithmetic, but then the bias was on no path and Keras warned
    "Gradients do not exist for variables [.../key_global/bias]" in every fit: on torch (G is
    eagerly the exact count) and on TF when the traced G = max_global_tokens is small (2 here).
    HF adds the bias to every global key (its gradient is rounding, ~1e-10 at this size, not 0
    nor None): so do we."""
    backbone = kb.models.LongformerBackbone(**dict(TINY, dropout=0.0, max_global_tokens=2))
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None)
    x = {k: v for k, v in _inputs(16).items() if k != "global_attention_mask"}  # global <s>
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = clf.fit(x, np.array([1, 0, 1]), batch_size=3, epochs=1, verbose=0)
    missing = [str(w.message) for w in caught if "Gradients do not exist" in str(w.message)]
    assert missing == [] and np.isfinite(history.history["loss"]).all()


def test_multiple_choice_fits_raw_strings_with_global_attention_on_the_choice(
        raw_text_multiple_choice):
    """MultipleChoice on a Longformer from raw (context, choices): no global-attention input (it
    was one its preprocessor never gave), global attention on the choice and its closing [SEP]
    (HF LongformerForMultipleChoice's rule: the tokens after the first separator and the one
    after it, which is RoBERTa's second `</s>`; with WordPiece's single [SEP] the same rule leaves
    the choice's first token out, as HF's would on such ids)."""
    from keras_bertfam.models.longformer import global_attention_for_task

    mc = raw_text_multiple_choice
    pre, tok = mc.preprocessor, mc.preprocessor.tokenizer
    assert "global_attention_mask" not in mc.input
    x = (["a great film", "dull"], [["great", "bad film"], ["bad", "a great film"]])
    history = mc.fit(x, [0, 0], batch_size=2, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert mc.predict(x, verbose=0).shape == (2, 2)
    features = pre(x)[0] if isinstance(pre(x), tuple) else pre(x)
    flat = {k: np.reshape(to_numpy(v), (4, -1)) for k, v in features.items()}
    glob = to_numpy(global_attention_for_task(flat, "MultipleChoice"))
    for row, mask in zip(flat["token_ids"], glob):
        sep = list(row).index(tok.token_to_id("[SEP]"))
        real = int((row != 0).sum())
        expected = [0] * (sep + 2) + [1] * (real - sep - 2) + [0] * (len(row) - real)
        assert mask.tolist() == expected


# === from_bert: BERT (and the real MiniLM) -> Longformer ===
def _bert_inputs(length, vocab=120, padded=True, seed=0):
    """[CLS]=2 first, BERT's single-segment inputs; rows 1 and 2 right-padded when `padded`."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, vocab, (3, length)).astype("int32")
    ids[:, 0] = 2
    mask = np.ones_like(ids)
    if padded:
        mask[1, length // 2:] = 0
        mask[2, 3:] = 0
        ids[mask == 0] = 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def _assert_longformer_equals_bert(bert, longformer, x, global_cls):
    expected = to_numpy(bert(x)["sequence_output"])
    glob = np.zeros_like(x["token_ids"])
    glob[:, 0] = int(global_cls)
    got = longformer(dict(x, global_attention_mask=glob))["sequence_output"]
    assert _max_diff(got, expected, x["padding_mask"]) <= 1e-4


@pytest.mark.multibackend
def test_from_bert_with_a_covering_window_equals_bert():
    """A window covering the input (w >= 2T: every token sees every other) makes the converted
    Longformer compute BERT's last hidden states, with or without padding (inputs padded and
    not, one conversion for both), with or without global attention on [CLS] (its global
    projections are the local ones)."""
    bert = kb.models.BertBackbone(120, 2, 2, 16, 32, max_sequence_length=20)
    longformer = kb.models.LongformerBackbone.from_bert(bert, max_sequence_length=64,
                                                        attention_window=36)
    assert longformer.layer_norm_epsilon == bert.layer_norm_epsilon == 1e-12
    table = to_numpy(longformer.embeddings.position_embedding.embeddings)
    learned = to_numpy(bert.embeddings.position_embedding.embeddings)
    np.testing.assert_array_equal(table[2:22], learned)  # from ROBERTA_POSITION_OFFSET on
    np.testing.assert_array_equal(table[22:42], learned)  # copied again
    np.testing.assert_array_equal(to_numpy(longformer.embeddings.segment_embedding.embeddings),
                                  to_numpy(bert.embeddings.segment_embedding.embeddings)[:1])
    attn = longformer.blocks[1].attention.attention
    np.testing.assert_array_equal(to_numpy(attn.query_global_dense.kernel),
                                  to_numpy(attn.query_dense.kernel))
    # a narrow window is not full attention
    narrow = kb.models.LongformerBackbone.from_bert(bert, max_sequence_length=64,
                                                    attention_window=4)
    for padded in (True, False):
        x = _bert_inputs(18, padded=padded)
        for global_cls in (False, True):
            _assert_longformer_equals_bert(bert, longformer, x, global_cls)
        expected = to_numpy(bert(x)["sequence_output"])
        got = narrow(dict(x, global_attention_mask=np.zeros_like(x["token_ids"])))
        assert _max_diff(got["sequence_output"], expected, x["padding_mask"]) > 1e-3, padded


def test_from_bert_real_minilm_equals_minilm(minilm_dir):
    """The real MiniLM (L6/H384, preset `all_minilm_l6_v2`) converted at 4,096 positions: the
    same last hidden states as MiniLM on 40-token inputs under a covering window."""
    minilm = kb.models.BertBackbone.from_preset("all_minilm_l6_v2")
    longformer = kb.models.LongformerBackbone.from_bert(minilm, max_sequence_length=4096,
                                                        attention_window=80)
    assert longformer.max_sequence_length == 4096 and longformer.num_layers == 6
    for padded in (True, False):
        x = _bert_inputs(40, vocab=30522, padded=padded, seed=1)
        _assert_longformer_equals_bert(minilm, longformer, x, global_cls=True)


def test_from_bert_refuses_other_sources_and_fewer_positions(tmp_path):
    """from_bert takes a BERT (object, preset name or dir); a RoBERTa (object or preset), an
    activation the Longformer lacks, or a max_sequence_length under BERT's positions is refused,
    naming the value; from_roberta refuses a BERT object likewise."""
    bert = kb.models.BertBackbone(120, 2, 2, 16, 32, max_sequence_length=20)
    bert.save_to_preset(str(tmp_path / "bert"))
    from_dir = kb.models.LongformerBackbone.from_bert(str(tmp_path / "bert"),
                                                      max_sequence_length=64, attention_window=4)
    from_object = kb.models.LongformerBackbone.from_bert(bert, max_sequence_length=64,
                                                         attention_window=4)
    x = dict(_bert_inputs(18), global_attention_mask=np.zeros((3, 18), "int32"))
    np.testing.assert_allclose(to_numpy(from_dir(x)["sequence_output"]),
                               to_numpy(from_object(x)["sequence_output"]), atol=1e-6)
    roberta = kb.models.RobertaBackbone(120, 2, 2, 16, 32, max_sequence_length=20)
    with pytest.raises(ValueError, match="from_bert takes a BertBackbone .* got a "
                                         "RobertaBackbone \\(family 'roberta'\\)"):
        kb.models.LongformerBackbone.from_bert(roberta)
    with pytest.raises(ValueError, match="from_roberta takes a RobertaBackbone .* got a "
                                         "BertBackbone"):
        kb.models.LongformerBackbone.from_roberta(bert)
    with pytest.raises(ValueError, match="'roberta_base_en' is a 'roberta' preset"):
        kb.models.LongformerBackbone.from_bert("roberta_base_en")
    with pytest.raises(ValueError, match="max_sequence_length=16 is shorter than the BERT "
                                         "checkpoint's 20 positions"):
        kb.models.LongformerBackbone.from_bert(bert, max_sequence_length=16, attention_window=4)
    approximate = kb.models.BertBackbone(120, 2, 2, 16, 32, max_sequence_length=20,
                                         activation="gelu_approximate")
    with pytest.raises(ValueError, match="from_bert cannot convert this BertBackbone: it has "
                                         "activation='gelu_approximate'"):
        kb.models.LongformerBackbone.from_bert(approximate, attention_window=4)


def test_hf_default_two_token_types_load_row_0(tmp_path):
    """HF's `LongformerConfig()` has type_vocab_size=2 (as RobertaConfig's); its model adds row 0
    of that table when not given token_type_ids: ours loads that row (it was refused)."""
    import torch
    import transformers

    torch.manual_seed(1)
    hf = transformers.LongformerModel(_hf_config(type_vocab_size=2)).eval()
    hf.save_pretrained(str(tmp_path))
    ours = kb.models.LongformerBackbone.from_preset(str(tmp_path))
    x = _inputs(16)
    ref = _hf_run(hf, x, global_attention_mask=torch.tensor(x["global_attention_mask"]))
    assert _max_diff(ours(x)["sequence_output"], ref.last_hidden_state.numpy(),
                     x["padding_mask"]) <= 1e-4


def test_hf_config_with_a_window_list_not_one_per_layer_is_refused(hf_dir, tmp_path):
    """HF's LongformerModel refuses a config whose attention_window list does not have one entry
    per layer; ours read a one-entry list as that window for every layer (a 2-layer checkpoint
    with `attention_window: [4]` loaded as [4, 4])."""
    import json
    import shutil

    for windows in ([4], [4, 8, 8]):
        path = tmp_path / f"windows_{len(windows)}"
        shutil.copytree(hf_dir, path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(dict(config, attention_window=windows)))
        with pytest.raises(ValueError, match=rf"attention_window=.* has {len(windows)} entries for "
                                             r"num_layers=2"):
            kb.models.LongformerBackbone.from_preset(str(path))


@pytest.mark.multibackend
def test_masks_not_0_or_1_are_refused(tiny):
    """HF's LongformerModel reads `attention_mask * (global_attention_mask + 1)`: a padding_mask
    of 2 makes a token global there, a global_attention_mask of -1 makes it padding. Ours read
    any nonzero value as 1 (a 2 in padding_mask local, a -1 global): silently other numbers.
    Now a ValueError eagerly and from predict, in memory or from a dataset (every backend; the
    tasks' message, naming the position) and an InvalidArgumentError in a traced TensorFlow
    graph, naming the mask and the value; a padding_mask's with HF's meaning of a 2 on every
    path (an eager call had lost it)."""
    import tensorflow as tf

    backbone = tiny
    x = _inputs(13)
    for name, value in (("global_attention_mask", -1), ("global_attention_mask", 2),
                        ("padding_mask", 2)):
        bad = x[name].copy()
        bad[1, 1] = value
        hint = re.escape(" HF's attention_mask of 2 (a global token) is global_attention_mask=1 "
                         "here.") if name == "padding_mask" else ""
        message = (rf"LongformerBackbone got {name} {value} at {name}\[1, 1\]: expected 0 and 1 "
                   rf"only \(.*\)\.{hint}")
        data = tf.data.Dataset.from_tensor_slices(dict(x, **{name: bad})).batch(3)
        for call in (lambda: backbone(dict(x, **{name: bad})),
                     lambda: backbone.predict(dict(x, **{name: bad}), verbose=0),
                     lambda: backbone.predict(data, verbose=0)):
            with pytest.raises(ValueError, match=message):
                call()
        if keras.backend.backend() == "tensorflow":  # a traced graph: its Assert, the same hint
            tensors = {k: tf.constant(v) for k, v in dict(x, **{name: bad}).items()}
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=rf"{name} must hold 0 and 1 only, got\] \[{value}\] "
                                     rf"\[\(.*\)\.{hint}\]".replace("'", r"\\?'")):  # (C-escaped)
                tf.function(backbone)(tensors)
    backbone(x)  # 0 / 1 masks run


def test_export_to_transformers_refuses_windows_hf_cannot_run(tmp_path):
    """HF's LongformerModel pads its inputs to a multiple of the largest window and asserts each
    layer's length is a multiple of its own window; it fails on a window of 2 at any length.
    Ours runs these windows, and exported them to a directory HF loads but fails on (windows
    [6, 4]: 17 of the lengths 1-29; [2, 2]: every length). Now refused, naming the window."""
    for windows, message in (([6, 4], r"attention_window=\[6, 4\].*layer 1's 4 does not divide "
                                      r"the largest window, 6"),
                             ([2, 4], r"attention_window=\[2, 4\].*layer 0's window of 2")):
        backbone = kb.models.LongformerBackbone(**dict(TINY, attention_window=windows))
        with pytest.raises(ValueError, match=message):
            kb.presets.export_to_transformers(backbone, str(tmp_path / "out"))
        assert not (tmp_path / "out").exists()
    # windows HF runs at every length: exported ([4, 8] in test_export_to_transformers_round_trip)
    backbone = kb.models.LongformerBackbone(**dict(TINY, attention_window=[12, 4]))
    kb.presets.export_to_transformers(backbone, str(tmp_path / "ok"))


@pytest.mark.multibackend
def test_predict_refuses_more_tokens_than_max_sequence_length():
    """`backbone.predict` on rows longer than max_sequence_length: the check of the inputs ran
    only on a static length and after the embeddings could run, so JAX's predict stopped in
    the embeddings' slice (a TypeError on the position table's shape) and TensorFlow's, once it
    had retraced for a new length, with an InvalidArgumentError from a slice. Now the error
    names the length and max_sequence_length on every backend."""
    backbone = kb.models.LongformerBackbone(**dict(TINY, num_layers=1, attention_window=4,
                                                   max_sequence_length=32))
    message = r"40\]? \[?tokens.*max_sequence_length=32"  # TF's Assert: "[40] [tokens"
    backbone.predict(_inputs(32, global_tokens=False), verbose=0)
    backbone.predict(_inputs(24, global_tokens=False), verbose=0)  # TF: retraced, length None
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
            backbone.predict(_inputs(40, global_tokens=False), verbose=0)
    else:
        with pytest.raises(ValueError, match=message):
            backbone.predict(_inputs(40, global_tokens=False), verbose=0)


@pytest.mark.multibackend
@pytest.mark.parametrize("source, options, message", [
    ("roberta", {"max_sequence_length": "64"}, r"max_sequence_length='64'; expected a positive"),
    ("roberta", {"max_sequence_length": None}, r"max_sequence_length=None; expected a positive"),
    ("roberta", {"max_sequence_length": -1}, r"max_sequence_length=-1; expected a positive"),
    ("bert", {"max_sequence_length": 64.0}, r"from_bert: max_sequence_length=64.0; expected"),
    ("missing", {"attention_window": 3}, r"attention_window must be a positive even integer "
                                         r"\(w/2 tokens on each side\), got 3"),
    ("missing", {"attention_window": 0}, r"attention_window must be .* got 0"),
], ids=["length_str", "length_none", "length_negative", "length_float", "odd_window_first",
        "zero_window_first"])
def test_from_encoder_refuses_bad_lengths_and_windows_first(tmp_path, source, options, message):
    """A length of another type was Python's "'<' not supported between 'str' and 'int'"; a bad
    window was found only after the checkpoint loaded (a missing one's error came first)."""
    small = dict(vocabulary_size=120, num_layers=1, num_heads=2, hidden_dim=16,
                 intermediate_dim=32, max_sequence_length=20)
    method, source = {
        "roberta": ("from_roberta", lambda: kb.models.RobertaBackbone(**small)),
        "bert": ("from_bert", lambda: kb.models.BertBackbone(**small)),
        "missing": ("from_roberta", lambda: str(tmp_path / "no_such_preset"))}[source]
    arguments = dict(dict(max_sequence_length=64, attention_window=4), **options)
    with pytest.raises(ValueError, match=message):
        getattr(kb.models.LongformerBackbone, method)(source(), **arguments)
