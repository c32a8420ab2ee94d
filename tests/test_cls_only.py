"""The [CLS]-only last layer (`backbone(x, cls_only=True)`, TextClassifier / MultipleChoice's
default) and the masked-rows-only one (`backbone(x, positions=...)`, MaskedLM / BertPretrainer /
AlbertPretrainer's default): the same logits and gradients as the full path on every
EncoderBackbone family and every backend, fewer rows computed, the same weights and saved paths,
the full path kept for XLNet and Longformer."""
import contextlib

import h5py
import keras
import numpy as np
import pytest
from keras import ops

import keras_bertfam as kb
from keras_bertfam.layers import TransformerBlock
from tests.conftest import to_numpy

pytestmark = pytest.mark.multibackend

SIZES = dict(vocabulary_size=300, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=32, dropout=0.0)
FAMILIES = {
    "bert": lambda: kb.models.BertBackbone(**SIZES),
    "bert_pruned": lambda: kb.models.BertBackbone(**SIZES, heads_per_layer=[1, 2]),
    "bert_last_layer_no_heads": lambda: kb.models.BertBackbone(**SIZES, heads_per_layer=[2, 0]),
    "roberta": lambda: kb.models.RobertaBackbone(**SIZES),
    "albert_shared_repeated": lambda: kb.models.AlbertBackbone(
        **SIZES, embedding_dim=8, num_groups=1, num_inner_repetitions=2),
    "albert_share_attention": lambda: kb.models.AlbertBackbone(
        **SIZES, embedding_dim=8, num_groups=1, share="attention"),
    "distil_bert": lambda: kb.models.DistilBertBackbone(**SIZES),
    "electra": lambda: kb.models.ElectraBackbone(**SIZES, embedding_dim=8),
    "spanbert": lambda: kb.models.SpanBertBackbone(**SIZES),
}


def _inputs(batch=4, length=9, seed=0):
    """Mixed padding, sentence pairs (segments 0 then 1)."""
    rng = np.random.RandomState(seed)
    lengths = np.array([length, 6, 3, 8, 5, 7][:batch])
    padding = (np.arange(length)[None] < lengths[:, None]).astype("int32")
    segments = ((np.arange(length)[None] >= lengths[:, None] // 2) * padding).astype("int32")
    token_ids = rng.randint(5, 300, (batch, length)).astype("int32") * padding
    return {"token_ids": token_ids, "segment_ids": segments, "padding_mask": padding}


def _for(model, x):
    return {k: v for k, v in x.items() if k in model.input}


def _fast_and_full(make_backbone, num_classes=3):
    backbone = make_backbone()
    fast = kb.tasks.TextClassifier(backbone, num_classes=num_classes, dropout=0.0)
    full = kb.tasks.TextClassifier(backbone, num_classes=num_classes, dropout=0.0,
                                   cls_only=False)
    full.set_weights(fast.get_weights())  # the heads' (the backbone is shared)
    return fast, full


def _loss_and_grads(task, x, y, loss_of=None):
    """Cross-entropy of the logits (or `loss_of(outputs)`) and its gradients w.r.t. the
    trainable variables, in inference mode (no dropout); JAX through `stateless_call`, as its fit
    does."""
    backend = keras.backend.backend()
    variables = task.trainable_variables
    x = {k: ops.convert_to_tensor(v) for k, v in _for(task, x).items()}

    if loss_of is None:
        def loss_of(logits):
            return ops.mean(ops.sparse_categorical_crossentropy(y, logits, from_logits=True))

    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = task(x, training=False)
            loss = loss_of(logits)
        grads = tape.gradient(loss, variables)
    elif backend == "jax":
        import jax

        def f(values):
            logits, _ = task.stateless_call(values, task.non_trainable_variables, x,
                                            training=False)
            return loss_of(logits), logits

        (loss, logits), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(
            [v.value for v in variables])
    else:
        for v in variables:
            v.value.grad = None
        logits = task(x, training=False)
        loss = loss_of(logits)
        loss.backward()
        grads = [v.value.grad for v in variables]
    return keras.tree.map_structure(to_numpy, logits), [
        np.zeros(v.shape) if g is None else to_numpy(g) for v, g in zip(variables, grads)]


@contextlib.contextmanager
def _rows_seen(backbone, x):
    """Records the rows per example each feed-forward call of `backbone` computes, in call
    order, while the block runs (the feed-forward's Dense layers take the rows (B·T, H) of its
    (B, T, H) input): the task call whose outputs a test compares records them (under JAX's jit
    the calls are traced with the same shapes), with no eager pass of its own."""
    seen, patched = [], []
    batch = int(np.prod(np.shape(x["token_ids"])[:-1]))  # the backbone's rows (B·C for choices)
    for block in backbone.encoder.blocks:
        dense = block.feedforward.intermediate_dense
        if dense in patched:  # a feed-forward sublayer shared by several blocks
            continue
        patched.append(dense)

        def recorded(inputs, *args, _call=dense.call, **kwargs):
            seen.append(int(inputs.shape[0]) // batch)
            return _call(inputs, *args, **kwargs)

        dense.call = recorded
    try:
        yield seen
    finally:
        for dense in patched:
            del dense.call


# The distinct code paths through the last layer on JAX and torch (compiling and building each
# family costs ~10 s there): attention with pruned heads, a last layer with none, ALBERT's shared
# and repeated blocks, no pooler. The other families add nothing to those paths (an embedding
# projection, position offsets, segments) and run on TensorFlow.
ON_EVERY_BACKEND = ("bert_pruned", "bert_last_layer_no_heads", "albert_shared_repeated",
                    "distil_bert")
EVERY_FAMILY = [
    f if f in ON_EVERY_BACKEND else pytest.param(f, marks=pytest.mark.skipif(
        keras.backend.backend() != "tensorflow",
        reason="the same keras.ops path as the ON_EVERY_BACKEND families, run on TensorFlow"))
    for f in sorted(FAMILIES)]


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_cls_only_classifier_equals_the_full_path(family):
    """Logits and every trainable weight's gradient equal the full path's (1e-5), with padding
    and pairs (JAX: compiled, through `stateless_call`); the last block call computes one row
    per example (every other call, and the full path, all 9)."""
    fast, full = _fast_and_full(FAMILIES[family])
    x = _inputs()
    y = np.array([0, 2, 1, 2])
    with _rows_seen(fast.backbone, x) as rows_fast:
        logits_fast, grads_fast = _loss_and_grads(fast, x, y)
    with _rows_seen(full.backbone, x) as rows:
        logits_full, grads_full = _loss_and_grads(full, x, y)
    assert rows == [9] * len(rows) and rows_fast == [9] * (len(rows) - 1) + [1]
    np.testing.assert_allclose(logits_fast, logits_full, atol=1e-5, rtol=1e-5)
    assert [v.path for v in fast.trainable_variables] == [v.path for v in
                                                          full.trainable_variables]
    for v, a, b in zip(fast.trainable_variables, grads_fast, grads_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=v.path)
    assert any(np.abs(g).max() > 0 for g in grads_fast[:-2])  # the backbone is trained


def test_backbone_cls_only_outputs_and_spec():
    """`backbone(x, cls_only=True)`: the [CLS] row (B, 1, H) and the same pooled output, eager
    and symbolic; the functional (full) call unchanged."""
    backbone = FAMILIES["bert"]()
    x = _inputs()
    full, fast = backbone(x), backbone(x, cls_only=True)
    assert tuple(fast["sequence_output"].shape) == (4, 1, 16)
    np.testing.assert_allclose(to_numpy(fast["sequence_output"]),
                               to_numpy(full["sequence_output"])[:, :1], atol=1e-5)
    np.testing.assert_allclose(to_numpy(fast["pooled_output"]), to_numpy(full["pooled_output"]),
                               atol=1e-5)
    inputs = {k: keras.Input((None,), dtype="int32", name=k) for k in backbone.input}
    spec = backbone(inputs, cls_only=True)
    assert tuple(spec["sequence_output"].shape) == (None, 1, 16)
    assert tuple(spec["pooled_output"].shape) == (None, 16)
    assert tuple(backbone(inputs)["sequence_output"].shape) == (None, None, 16)
    fast = kb.tasks.TextClassifier(backbone, num_classes=3, dropout=0.0)
    full = kb.tasks.TextClassifier(backbone, num_classes=3, dropout=0.0, cls_only=False)
    full.set_weights(fast.get_weights())
    np.testing.assert_allclose(fast.predict(_for(fast, x), verbose=0),  # compiled
                               full.predict(_for(full, x), verbose=0), atol=1e-5, rtol=1e-5)


def test_xlnet_and_longformer_keep_the_full_path():
    """The capability is per family: XLNet (summary from the last token, relative attention)
    and Longformer (global attention) have no [CLS]-only path; their classifiers run in full."""
    assert all(cls.supports_cls_only for cls in (
        kb.models.BertBackbone, kb.models.RobertaBackbone, kb.models.AlbertBackbone,
        kb.models.DistilBertBackbone, kb.models.ElectraBackbone, kb.models.SpanBertBackbone))
    assert not kb.models.XLNetBackbone.supports_cls_only
    assert not kb.models.LongformerBackbone.supports_cls_only
    longformer = kb.models.LongformerBackbone(
        vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
        attention_window=4, max_sequence_length=32)
    x = {"token_ids": np.array([[0, 5, 6, 7, 8, 2]]), "segment_ids": np.zeros((1, 6), "int32"),
         "padding_mask": np.ones((1, 6), "int32"),
         "global_attention_mask": np.array([[1, 0, 0, 0, 0, 0]])}
    with pytest.raises(ValueError, match="LongformerBackbone has no \\[CLS\\]-only path"):
        longformer(x, cls_only=True)
    clf = kb.tasks.TextClassifier(longformer, num_classes=2)  # cls_only=True: not applicable
    assert clf.predict({k: v for k, v in x.items() if k in clf.input}, verbose=0).shape == (1, 2)


def test_multiple_choice_cls_only_equals_the_full_path():
    backbone = FAMILIES["electra"]()
    fast = kb.tasks.MultipleChoice(backbone, dropout=0.0)
    full = kb.tasks.MultipleChoice(backbone, dropout=0.0, cls_only=False)
    full.set_weights(fast.get_weights())
    x = {k: v.reshape(2, 2, -1) for k, v in _inputs().items()}  # (B=2, C=2, T)
    with _rows_seen(backbone, x) as rows_fast:
        out_fast = to_numpy(fast(x, training=False))
    with _rows_seen(backbone, x) as rows_full:
        out_full = to_numpy(full(x, training=False))
    assert rows_fast == [9, 1] and rows_full == [9, 9]
    np.testing.assert_allclose(out_fast, out_full, atol=1e-5, rtol=1e-5)


def test_cls_only_keeps_weights_paths_config_and_trains(tmp_path):
    """The weights file of the fast task has the keys of the full one (the graph of the code
    before the fast path); the task config round-trips `cls_only`; `fit` trains with dropout."""
    fast, full = _fast_and_full(FAMILIES["albert_shared_repeated"])

    def keys(task, name):
        path = str(tmp_path / f"{name}.weights.h5")
        task.save_weights(path)
        found = []
        with h5py.File(path, "r") as f:
            f.visit(found.append)
        return found

    assert keys(fast, "fast") == keys(full, "full")
    for task, expected in ((fast, True), (full, False)):
        config = task.get_config()
        assert config["cls_only"] is expected
        again = kb.tasks.TextClassifier.from_config(config)
        assert again.cls_only is expected
        again.load_weights(str(tmp_path / "fast.weights.h5"))
        np.testing.assert_allclose(to_numpy(again(_for(again, _inputs()), training=False)),
                                   to_numpy(fast(_for(fast, _inputs()), training=False)),
                                   atol=1e-5)
    clf = kb.tasks.TextClassifier(kb.models.BertBackbone(**dict(SIZES, dropout=0.1)),
                                  num_classes=3)
    clf.compile(learning_rate=1e-3)
    history = clf.fit(_for(clf, _inputs()), np.array([0, 2, 1, 2]), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


@pytest.mark.parametrize("norm_first", [False, True])
def test_block_query_rows_equal_those_rows_of_the_full_output(norm_first):
    """Post-LN and pre-LN blocks, a (B, T, S) attention mask and a head mask: the `query_rows`
    output (a slice, or each example's positions) is those rows of the full output."""
    block = TransformerBlock(intermediate_dim=16, num_heads=2, norm_first=norm_first)
    rng = np.random.RandomState(0)
    x = ops.convert_to_tensor(rng.randn(2, 6, 8).astype("float32"))
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2], "int32")
    causal = np.tril(np.ones((6, 6), "int32"))[None].repeat(2, 0)
    positions = np.array([[5, 0, 5], [3, 1, 4]], "int32")  # each example's own (repeated) rows
    for kwargs in ({}, {"attention_mask": causal}, {"head_mask": np.array([1.0, 0.0])}):
        full = to_numpy(block(x, padding_mask=padding, **kwargs))
        rows = to_numpy(block(x, padding_mask=padding, query_rows=slice(2, 4), **kwargs))
        np.testing.assert_allclose(rows, full[:, 2:4], atol=1e-5, err_msg=str(kwargs))
        rows = to_numpy(block(x, padding_mask=padding, query_rows=positions, **kwargs))
        np.testing.assert_allclose(rows, np.take_along_axis(full, positions[..., None], 1),
                                   atol=1e-5, err_msg=str(kwargs))


def test_stack_return_all_takes_no_last_layer_rows():
    backbone = FAMILIES["bert"]()
    x = backbone.embeddings(ops.convert_to_tensor(_inputs()["token_ids"]))
    with pytest.raises(ValueError, match="takes no last_layer_rows"):
        backbone.encoder(x, return_all=True, last_layer_rows=slice(0, 1))


# === The masked rows only (MaskedLM, BertPretrainer, AlbertPretrainer) ===

# Per example: padding slots (position 0, weight 0), a repeated position, a position in the
# padding (example 2 has 3 real tokens), one example with no weighted slot.
MASK_POSITIONS = np.array([[1, 4, 4, 0, 0], [2, 5, 3, 8, 0], [1, 2, 6, 0, 0], [0, 0, 0, 0, 0]],
                          "int32")
MASK_WEIGHTS = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]],
                        "float32")
MASK_IDS = np.random.RandomState(1).randint(0, 300, MASK_POSITIONS.shape).astype("int32")


def _mlm_inputs():
    return dict(_inputs(), mask_positions=MASK_POSITIONS)


def _mlm_loss(outputs):
    """The tasks' losses: weighted MLM CE (+ the pair CE of a BERT / ALBERT pretrainer's)."""
    mlm = outputs["mlm_logits"] if isinstance(outputs, dict) else outputs
    ce = ops.sparse_categorical_crossentropy(MASK_IDS, mlm, from_logits=True)
    loss = ops.sum(ops.multiply(ce, MASK_WEIGHTS)) / (np.sum(MASK_WEIGHTS) + 1e-5)
    if isinstance(outputs, dict) and "pair_logits" in outputs:
        loss = loss + ops.mean(ops.sparse_categorical_crossentropy(
            np.array([0, 1, 1, 0]), outputs["pair_logits"], from_logits=True))
    return loss


def _assert_same(fast, full, x, family):
    """Outputs and every trainable weight's gradient equal the full path's (1e-5); the last
    block call computes P rows per example (+1 for [CLS] with a pooler), every other call (and
    the full path) all 9."""
    backbone = fast.backbone
    with _rows_seen(backbone, x) as rows_fast:
        out_fast, grads_fast = _loss_and_grads(fast, x, None, _mlm_loss)
    with _rows_seen(backbone, x) as rows:
        out_full, grads_full = _loss_and_grads(full, x, None, _mlm_loss)
    last = MASK_POSITIONS.shape[1] + (backbone.pooler_dense is not None)
    assert rows == [9] * len(rows) and rows_fast == [9] * (len(rows) - 1) + [last]
    keras.tree.map_structure(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=family),
        out_fast, out_full)
    assert [v.path for v in fast.trainable_variables] == [v.path for v in
                                                          full.trainable_variables]
    for v, a, b in zip(fast.trainable_variables, grads_fast, grads_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=f"{family} {v.path}")
    last_block = backbone.encoder.layer_blocks(backbone.num_layers - 1)[-1]
    ffn = [i for i, v in enumerate(fast.trainable_variables)
           if v is last_block.feedforward.intermediate_dense.kernel]
    assert ffn and np.abs(grads_fast[ffn[0]]).max() > 0  # the last layer's rows are trained


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_masked_lm_rows_only_equals_the_full_path(family):
    """MaskedLM's logits and gradients with the last layer at the mask positions only equal
    the full path's, with padding slots, repeated positions and a position in the padding."""
    backbone = FAMILIES[family]()
    fast = kb.tasks.MaskedLM(backbone)
    full = kb.tasks.MaskedLM(backbone, masked_rows_only=False)
    full.set_weights(fast.get_weights())  # the heads' (the backbone is shared)
    _assert_same(fast, full, _mlm_inputs(), family)


@pytest.mark.parametrize("task, family", [(kb.tasks.BertPretrainer, "bert"),
                                          (kb.tasks.AlbertPretrainer, "albert_shared_repeated")])
def test_pretrainers_rows_only_equal_the_full_path(task, family):
    """BertPretrainer / AlbertPretrainer: the MLM logits, the pair logits (the pooled [CLS]
    row, computed with the masked rows) and the gradients equal the full path's."""
    backbone = FAMILIES[family]()
    fast, full = task(backbone), task(backbone, masked_rows_only=False)
    full.set_weights(fast.get_weights())
    _assert_same(fast, full, _mlm_inputs(), family)


def test_backbone_positions_outputs_and_spec():
    """`backbone(x, positions=p)`: the full sequence output's rows at p (B, P, H), the same
    pooled output, eager and symbolic; refused with cls_only, and on Longformer."""
    backbone = FAMILIES["bert"]()
    x = _inputs()
    full, fast = backbone(x), backbone(x, positions=MASK_POSITIONS)
    assert tuple(fast["sequence_output"].shape) == (4, 5, 16)
    expected = np.take_along_axis(to_numpy(full["sequence_output"]), MASK_POSITIONS[..., None], 1)
    np.testing.assert_allclose(to_numpy(fast["sequence_output"]), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(fast["pooled_output"]), to_numpy(full["pooled_output"]),
                               atol=1e-5)
    inputs = {k: keras.Input((None,), dtype="int32", name=k) for k in backbone.input}
    spec = backbone(inputs, positions=keras.Input((7,), dtype="int32"))
    assert tuple(spec["sequence_output"].shape) == (None, 7, 16)
    assert tuple(spec["pooled_output"].shape) == (None, 16)
    with pytest.raises(ValueError, match="cls_only=True or positions, not both"):
        backbone(x, cls_only=True, positions=MASK_POSITIONS)
    with pytest.raises(ValueError, match=r"positions must be \(batch, P\) int, got shape \(5,\)"):
        backbone(x, positions=MASK_POSITIONS[0])


def test_masked_rows_only_keeps_weights_paths_config_and_trains(tmp_path):
    """The weights file of the fast MaskedLM has the keys of the full one; the config
    round-trips `masked_rows_only`; `fit` trains with dropout; a Longformer MLM (no rows path)
    runs in full."""
    backbone = FAMILIES["albert_shared_repeated"]()
    fast = kb.tasks.MaskedLM(backbone)
    full = kb.tasks.MaskedLM(backbone, masked_rows_only=False)
    paths = []
    for task, name in ((fast, "fast"), (full, "full")):
        paths.append(str(tmp_path / f"{name}.weights.h5"))
        task.save_weights(paths[-1])
    keys = []
    for path in paths:
        with h5py.File(path, "r") as f:
            keys.append([])
            f.visit(keys[-1].append)
    assert keys[0] == keys[1]
    x = _for(fast, _mlm_inputs())
    for task, expected in ((fast, True), (full, False)):
        config = task.get_config()
        assert config["masked_rows_only"] is expected
        again = kb.tasks.MaskedLM.from_config(config)
        assert again.masked_rows_only is expected
        again.load_weights(paths[0])
        np.testing.assert_allclose(to_numpy(again(x, training=False)),
                                   to_numpy(fast(x, training=False)), atol=1e-5)
    mlm = kb.tasks.MaskedLM(kb.models.BertBackbone(**dict(SIZES, dropout=0.1)))
    mlm.compile(learning_rate=1e-3)
    history = mlm.fit(_for(mlm, _mlm_inputs()), MASK_IDS, sample_weight=MASK_WEIGHTS, epochs=2,
                      verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    longformer = kb.models.LongformerBackbone(
        vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
        attention_window=4, max_sequence_length=32)
    lf_mlm = kb.tasks.MaskedLM(longformer)  # masked_rows_only=True: not applicable
    lf_x = {"token_ids": np.array([[0, 5, 6, 7, 8, 2]]), "padding_mask": np.ones((1, 6), "int32"),
            "mask_positions": np.array([[2, 3]], "int32")}
    assert lf_mlm.predict(_for(lf_mlm, lf_x), verbose=0).shape == (1, 2, 100)


def test_electra_generator_rows_only_equals_the_full_path():
    """ElectraPretrainer: the generator's last layer at the mask positions only (the
    discriminator in full); the MLM logits, the sampled ids (the same seed), the RTD logits and
    the MLM loss's gradients equal the full path's."""
    disc = FAMILIES["electra"]()
    fast = kb.tasks.ElectraPretrainer(discriminator=disc, seed=3)
    full = kb.tasks.ElectraPretrainer(generator=fast.generator, discriminator=disc, seed=3,
                                      masked_rows_only=False)
    full.set_weights(fast.get_weights())
    # No repeated position: the sampler writes one replacement a position (preprocessors never
    # repeat one).
    x = _for(fast, dict(_mlm_inputs(), mask_positions=np.where(
        MASK_POSITIONS == np.roll(MASK_POSITIONS, 1, axis=1), 0, MASK_POSITIONS)))
    with _rows_seen(fast.generator, x) as rows_fast:
        out_fast, grads_fast = _loss_and_grads(fast, x, None, _mlm_loss)
    with _rows_seen(full.generator, x) as rows_full:
        out_full, grads_full = _loss_and_grads(full, x, None, _mlm_loss)
    assert rows_full == [9, 9]
    assert rows_fast == [9, 5]  # no pooler: the P rows
    for key in ("mlm_logits", "sampled_ids", "rtd_logits"):
        np.testing.assert_allclose(out_fast[key], out_full[key], atol=1e-5, rtol=1e-5,
                                   err_msg=key)
    for v, a, b in zip(fast.trainable_variables, grads_fast, grads_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=v.path)
    assert full.get_config()["masked_rows_only"] is False


def test_masked_rows_only_from_preset(tmp_path, bert_vocab):
    """A saved MaskedLM preset reloads with its `masked_rows_only` and takes another from
    `from_preset` kwargs (the same weights load: the setting changes no weight)."""
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=2, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    pre = kb.preprocessing.MaskedLMPreprocessor(
        kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True), 9)
    saved = kb.tasks.MaskedLM(backbone, preprocessor=pre)
    saved.save_to_preset(str(tmp_path / "mlm"))
    same = kb.tasks.MaskedLM.from_preset(str(tmp_path / "mlm"))
    full = kb.tasks.MaskedLM.from_preset(str(tmp_path / "mlm"), masked_rows_only=False)
    assert same.masked_rows_only is True and full.masked_rows_only is False
    x = _for(saved, _mlm_inputs())
    expected = to_numpy(saved(x, training=False))
    for task in (same, full):
        np.testing.assert_allclose(to_numpy(task(x, training=False)), expected, atol=1e-5)
