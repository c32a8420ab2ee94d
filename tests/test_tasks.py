"""MaskedLM and BertPretrainer: losses, fit() on preprocessed and raw text, every backend."""
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from keras_bertfam.tasks.losses import weighted_sparse_ce
from tests.conftest import pipeline_builds, python_runs, to_numpy

pytestmark = pytest.mark.multibackend
# One layer: no test here is about depth (a train step's tracing grows with the layers).
TINY = dict(vocabulary_size=30522, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=64, dropout=0.0)


def _preprocessed(batch=8, length=16, predictions=3, seed=0):
    rng = np.random.RandomState(seed)
    x = {
        "token_ids": rng.randint(1000, 2000, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
        "mask_positions": np.tile(np.arange(1, 1 + predictions), (batch, 1)).astype("int32"),
    }
    mask_ids = rng.randint(1000, 2000, (batch, predictions)).astype("int32")
    return x, mask_ids, np.ones((batch, predictions), "float32")


def test_mlm_loss_is_berts_weighted_mean():
    rng = np.random.RandomState(0)
    logits = rng.randn(2, 3, 7).astype("float32")
    labels = rng.randint(0, 7, (2, 3))
    weights = np.array([[1, 1, 0], [1, 0, 0]], "float32")
    loss, _ = weighted_sparse_ce(labels, logits, weights)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(to_numpy(loss), (ce * weights).sum() / (weights.sum() + 1e-5),
                               rtol=1e-5)


def test_masked_lm_fits_keras_hub_format(tmp_path):
    """keras-hub's `fit(x, y, sample_weight)`; the first fit traces the train step once.

    The optimizer's slots exist before the step is traced. Keras on TensorFlow otherwise creates
    them inside the first trace, which then traces the step a second time with every slot
    initializer under a `tf.cond`: 3x the time of a tiny model's first `fit`."""
    mlm = kb.tasks.MaskedLM(kb.models.BertBackbone(**TINY))
    mlm.compile(learning_rate=3e-3)
    traces, train_step = [], mlm.train_step
    mlm.train_step = lambda *args: traces.append(1) or train_step(*args)
    x, y, w = _preprocessed()
    history = mlm.fit(x, y, sample_weight=w, batch_size=8, epochs=15, verbose=0).history
    del mlm.train_step
    # Traced once (TF, JAX); PyTorch runs it eagerly, once a step (15 epochs of one step).
    expected = 15 if keras.backend.backend() == "torch" else 1
    assert len(traces) == expected, f"the train step ran {len(traces)} times, not {expected}"
    assert history["mlm_loss"][-1] < history["mlm_loss"][0] - 1.0
    path = os.path.join(tmp_path, "mlm.keras")
    mlm.save(path)
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(again.predict(x, verbose=0)),
                               to_numpy(mlm.predict(x, verbose=0)), atol=1e-5)


def test_bert_pretrainer_reports_both_losses():
    task = kb.tasks.BertPretrainer(kb.models.BertBackbone(**TINY))
    task.compile(learning_rate=3e-3)
    x, mask_ids, weights = _preprocessed()
    y = {"mask_ids": mask_ids, "mask_weights": weights,
         "pair_labels": np.array([0, 1] * 4, "int32")}
    # 15 steps on the one batch, as 3 epochs of 5 (an epoch's own cost is ~1 s here)
    x, y = ({k: np.concatenate([v] * 5) for k, v in d.items()} for d in (x, y))
    history = task.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history
    for key in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
        assert key in history
    np.testing.assert_allclose(history["loss"][0],
                               history["mlm_loss"][0] + history["nsp_loss"][0], rtol=1e-4)
    assert history["loss"][-1] < history["loss"][0]


def test_pretrainers_fit_on_raw_text(bert_vocab):
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)
    # Documents for 6 (MLM blocks) and 8 (NSP pairs) batches of 8 an epoch (48 documents made
    # 55 NSP batches); an epoch's last partial batch is dropped in training (test_preprocessors).
    # The NSP pairs are grouped by length: batches of every width (JAX: multiples of 8).
    corpus = kb.preprocessing.read_corpus()
    for task_cls, documents, grouped in ((kb.tasks.MaskedLM, 48, False),
                                         (kb.tasks.BertPretrainer, 8, True)):
        docs = corpus.take(documents)
        backbone = kb.models.BertBackbone(**TINY)  # raw text is the point
        preprocessor = task_cls.default_preprocessor(tokenizer, backbone, sequence_length=32,
                                                     batch_size=8, seed=3,
                                                     group_by_length=grouped)
        task = task_cls(backbone, preprocessor=preprocessor)
        task.compile(learning_rate=1e-3)
        with pipeline_builds(task) as builds:
            history = task.fit(docs, epochs=2, verbose=0).history
        assert len(builds) == 1  # traced once: not also for the epoch's length
        assert np.isfinite(history["loss"]).all()
        assert history["mlm_loss"][-1] < history["mlm_loss"][0]


def test_fit_evaluate_and_predict_read_datasets_without_the_autotune_model(bert_vocab,
                                                                          monkeypatch):
    """TensorFlow 2.21 deletes an iterator whose tf.data autotuning model thread has run a while
    only after the thread's next wake-up (its sleep doubles up to 60 s, and the deletion holds
    the GIL): a 41 s `fit` spent 16.9 s after its last callback. fit, its validation, evaluate
    and predict hand Keras their datasets without the model thread; a dataset whose options set
    `autotune.enabled` keeps that setting."""
    from keras_bertfam.tasks import task as task_module

    handed = []
    original = task_module.without_autotune_model

    def spy(ds):
        handed.append(original(ds))
        return handed[-1]

    monkeypatch.setattr(task_module, "without_autotune_model", spy)
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)
    backbone = kb.models.BertBackbone(**TINY)
    preprocessor = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, batch_size=2, seed=0)
    mlm = kb.tasks.MaskedLM(backbone, preprocessor=preprocessor)
    texts = tf.data.Dataset.from_tensor_slices(["a good film", "a dull plot", "fine acting",
                                                "no story at all"]).batch(2)
    mlm.fit(texts, validation_data=texts, epochs=1, verbose=0)
    mlm.evaluate(texts, verbose=0)
    mlm.predict(texts, verbose=0)
    datasets = [d for d in handed if isinstance(d, tf.data.Dataset)]
    assert len(datasets) == 4, handed  # fit's, its validation's, evaluate's, predict's
    assert all(d.options().autotune.enabled is False for d in datasets)
    chosen = tf.data.Options()
    chosen.autotune.enabled = True
    assert original(tf.data.Dataset.range(3).with_options(chosen)).options().autotune.enabled
    assert original(tf.data.Dataset.range(3)).options().autotune.enabled is False
    assert original([1, 2]) == [1, 2]  # in-memory data: Keras' own adapters


def test_raw_list_of_strings_and_from_preset():
    task = kb.tasks.MaskedLM.from_preset("bert_tiny_en_uncased", load_weights=False,
                                         sequence_length=16, batch_size=2)
    task.compile()
    history = task.fit(["a great film", "a dull film", "acting was fine", "no plot"], epochs=1,
                       verbose=0).history
    assert np.isfinite(history["loss"][0])


def test_pretrainer_rejects_labelled_data(bert_vocab):
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16)
    with pytest.raises(ValueError, match="raw strings"):
        pre.prepare(tf.data.Dataset.from_tensor_slices((["a"], [1])))


def test_adamw_is_keras_adamw_with_repeated_sparse_rows_summed():
    """`kb.tasks.AdamW` (the tasks' default) takes Keras' AdamW arguments and gives its update on
    every backend; on TensorFlow it runs the fused `ResourceApplyAdam` kernel and squares an
    embedding's summed gradient, not each occurrence's slice (Keras' TF AdamW, unclipped, gave
    v = (1 - β2)(g₁² + g₂²) for a token seen twice; JAX and torch have dense gradients)."""
    def train(cls, **clip):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(50, 8),
                                  keras.layers.LayerNormalization(),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
        optimizer = cls(learning_rate=kb.tasks.WarmupLinearDecay(1e-2, 2, 10), weight_decay=0.01,
                        beta_2=0.999, epsilon=1e-6, **clip)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        model.fit(rng.integers(0, 50, (64, 5)), rng.integers(0, 3, (64,)), batch_size=8,
                  epochs=2, verbose=0, shuffle=False)
        return [to_numpy(v) for v in model.weights + optimizer.variables]

    class DenseAdamW(keras.optimizers.AdamW):
        """Keras' AdamW given dense gradients, as JAX and torch have them: its reference update
        (on TF, Keras would clip by the norm of the unsummed slices; see below)."""

        def _clip_gradients(self, grads):
            if keras.backend.backend() == "tensorflow":
                grads = [tf.convert_to_tensor(g) for g in grads]
            return super()._clip_gradients(grads)

    expected = train(DenseAdamW, global_clipnorm=1.0)
    got = train(kb.tasks.AdamW, global_clipnorm=1.0)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=2e-6)
    if keras.backend.backend() == "tensorflow":
        # Token 1 twice, slices 3 and 4: the gradient is [0, 7, 0, 0], clipped to norm 1.
        slices = tf.IndexedSlices(tf.constant([[3.0], [4.0]]), tf.constant([1, 1]),
                                  tf.constant([4, 1]))
        for cls, second in ((kb.tasks.AdamW, 1.0), (keras.optimizers.AdamW, 1.4)):
            (clipped,) = cls(1e-3, global_clipnorm=1.0)._clip_gradients([slices])
            np.testing.assert_allclose(to_numpy(tf.convert_to_tensor(clipped))[:, 0],
                                       [0.0, second, 0.0, 0.0], rtol=1e-6)  # Keras: norm 5

    # Token 1 twice: dL/dw = 2, so after one step v = (1 - β2) · 2².
    embedding = keras.layers.Embedding(4, 1, embeddings_initializer="zeros")
    embedding.build((None,))
    optimizer = kb.tasks.AdamW(learning_rate=1.0, weight_decay=0.0)
    optimizer.build(embedding.trainable_variables)
    if keras.backend.backend() == "tensorflow":
        def gradients():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(embedding(tf.constant([1, 1])))
            return tape.gradient(loss, embedding.trainable_variables)

        assert isinstance(gradients()[0], tf.IndexedSlices)
        step = tf.function(lambda: optimizer.apply(gradients(), embedding.trainable_variables))
        step()
        kernels = {op.type for op in step.get_concrete_function().graph.get_operations()}
        assert "ResourceApplyAdam" in kernels  # the fused kernel, not Keras' element-wise ops
    else:
        optimizer.apply([np.array([[0.0], [2.0], [0.0], [0.0]], "float32")],
                        embedding.trainable_variables)
    np.testing.assert_allclose(to_numpy(optimizer._velocities[0])[:, 0],
                               [0.0, 0.001 * 4.0, 0.0, 0.0], rtol=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's clipping (JAX and torch: Keras' own)")
def test_adamw_global_clipnorm_is_keras_bit_for_bit():
    """`kb.tasks.AdamW` takes each gradient's squared norm in one pass (`2 · l2_loss`): the
    clipped gradients are Keras' `clip_by_global_norm`'s bit for bit (dense gradients; an
    embedding's summed slices as their dense form), scaled down or left, in eager and traced
    calls, on tensors large enough for Eigen's threaded reduction; a NaN makes every gradient
    NaN, as in Keras."""
    from keras.src.optimizers.base_optimizer import clip_by_global_norm

    rng = np.random.default_rng(3)
    shapes = [(1200, 384), (384,), (16, 12, 32), (2, 384), (1536, 384)]
    rows = tf.IndexedSlices(tf.constant(rng.normal(0, 1e-2, (5, 384)), tf.float32),
                            tf.constant([7, 2, 40, 3, 11]), tf.constant([60, 384]))
    optimizer = kb.tasks.AdamW(1e-3, global_clipnorm=1.0)
    for scale in (1e-4, 1e-2, 3.0):
        grads = [tf.constant(rng.normal(0, scale, s), tf.float32) for s in shapes]
        expected = clip_by_global_norm(grads + [tf.convert_to_tensor(rows)], 1.0)
        for clip in (optimizer._clip_gradients, tf.function(optimizer._clip_gradients)):
            got = clip(grads + [rows])
            for g, want in zip(got, expected):
                np.testing.assert_array_equal(to_numpy(g), to_numpy(want))
    poisoned = [grads[0], tf.constant([np.nan, 1.0])]
    assert all(np.isnan(to_numpy(g)).all() for g in optimizer._clip_gradients(poisoned))
    graph = tf.function(optimizer._clip_gradients).get_concrete_function(grads).graph
    kernels = [op.type for op in graph.get_operations()]
    assert kernels.count("L2Loss") == len(shapes) and "Square" not in kernels
    # The halves summed, then doubled once (exact: the same bits), not one Mul a gradient.
    doubled = [op for op in graph.get_operations()
               if op.type == "Mul" and any(t.op.type == "L2Loss" for t in op.inputs)]
    assert not doubled, [op.name for op in doubled]


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="a property of the TensorFlow update's graph (JAX and torch: Keras' own)")
def test_adamw_builds_its_step_scalars_once_on_one_tensorflow_device():
    """On one TF device the step's scalars (β powers, the scheduled learning rate) are built once
    a step, not once a variable as Keras' path through `strategy.extended.update` did: a tiny
    task's train step had 2,625 graph ops, 1,927 after. The update is bit-identical (the test
    above compares it with Keras')."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    optimizer = kb.tasks.AdamW(learning_rate=kb.tasks.WarmupLinearDecay(1e-2, 2, 10),
                               weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    step = tf.function(lambda: optimizer.apply(
        [tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables))
    step()
    kernels = [op.type for op in step.get_concrete_function().graph.get_operations()]
    assert kernels.count("ResourceApplyAdam") == 6
    assert kernels.count("Pow") == 2  # β1ᵗ and β2ᵗ: Keras built 2 per variable (12)
    assert kernels.count("Maximum") == 2  # the schedule: once for the decay, once for Adam (Keras: 7)
    assert kernels.count("AssignSubVariableOp") == 6  # the weight decay, one a variable


@pytest.mark.multibackend
def test_compile_warns_that_keras_adam_is_wrong_on_tensorflow():
    """A Keras Adam / AdamW given to a task's compile on TensorFlow gets a warning naming the
    problem and kb.tasks.AdamW; ours, and every optimizer on JAX / torch, compile silently. The
    problem itself is asserted: the day Keras sums a repeated token's slices, this fails and the
    warning goes."""
    import warnings

    backbone = kb.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
                                      hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    task = kb.tasks.TextClassifier(backbone, num_classes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task.compile()
        task.compile(optimizer=kb.tasks.AdamW(1e-3))
        task.compile(optimizer=keras.optimizers.SGD(1e-3))
        if keras.backend.backend() != "tensorflow":
            task.compile(optimizer=keras.optimizers.AdamW(1e-3))
            return
    for cls in (keras.optimizers.Adam, keras.optimizers.AdamW):
        with pytest.warns(UserWarning, match=rf"keras.*\.{cls.__name__} on TensorFlow updates "
                                             r"the second moment .* kb.tasks.AdamW takes"
                          ) as caught:
            task.compile(optimizer=cls(1e-3))
        assert [w.filename for w in caught] == [__file__]
    # What the warning is about: token 1 twice, dL/dw = 1 + 1 = 2; Keras' v = (1 - β2)(1² + 1²).
    embedding = keras.layers.Embedding(4, 1, embeddings_initializer="zeros")
    embedding.build((None,))
    optimizer = keras.optimizers.AdamW(learning_rate=1.0, weight_decay=0.0)
    optimizer.build(embedding.trainable_variables)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(embedding(tf.constant([1, 1])))
    optimizer.apply(tape.gradient(loss, embedding.trainable_variables),
                    embedding.trainable_variables)
    np.testing.assert_allclose(to_numpy(optimizer._velocities[0])[:, 0],
                               [0.0, 0.001 * 2.0, 0.0, 0.0], rtol=1e-4)


@pytest.mark.parametrize("family", sorted(kb.presets.FAMILIES))
def test_training_runs_dropout_in_every_family(family):
    """`model(x, training=True)` (fit's call on TF and torch) and `stateless_call(...,
    training=True)` (JAX's) reach the layers: a backbone's or task's `call` that did not name
    `training` in its signature never received it from Keras, and every layer ran with its
    default, training=False: no dropout in fit (2026-11-23 to 11-25)."""
    spec = kb.presets.FAMILIES[family]
    extra = {"albert": {"embedding_dim": 16}}.get(family, {})
    backbone = spec.backbone_cls(**dict(TINY, vocabulary_size=3000, dropout=0.5, **extra))
    x, _, _ = _preprocessed(batch=2)
    x["global_attention_mask"] = np.zeros_like(x["token_ids"])  # Longformer's
    x = {k: v for k, v in x.items() if k in backbone.input}

    def differs(model, stateless=False):
        inputs = {k: v for k, v in x.items() if k in model.input}

        def run(training):
            if stateless:
                out, _ = model.stateless_call(
                    [v.value for v in model.trainable_variables],
                    [v.value for v in model.non_trainable_variables], inputs, training=training)
            else:
                out = model(inputs, training=training)
            return to_numpy(out["sequence_output"] if isinstance(out, dict) else out)

        return not np.allclose(run(True), run(False))

    assert differs(backbone)
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None)
    assert differs(clf)
    assert differs(clf, stateless=True)
    if family != "xlnet":  # XLNet pretrains by permutation, not with MaskedLM
        x["mask_positions"] = np.array([[1, 2], [3, 4]], "int32")
        assert differs(kb.tasks.MaskedLM(backbone, preprocessor=None))


def test_a_task_built_in_a_remat_scope_trains_or_says_why_it_cannot():
    """A task built in `keras.RematScope(mode="full")` (Keras rematerializes every layer's
    call): on torch its fit trains (the loss finite, every weight moves). On JAX and TensorFlow
    Keras cannot run it right (its own Dropout and Dense fail so too; TensorFlow's eager
    recomputation draws the dropout masks again: the gradient of other masks): the first step
    is a clear ValueError naming the scope's mode (Keras' own errors came from deep inside the
    step, on JAX "'str' object has no attribute '_error_repr'"), and the task built in
    `RematScope(mode="activations")`, which the error suggests, trains."""
    ids = np.random.RandomState(0).randint(5, 50, (2, 8)).astype("int32")
    x, y = {"token_ids": ids, "padding_mask": np.ones_like(ids)}, np.array([0, 1])

    def classifier(mode):
        with keras.RematScope(mode=mode):
            backbone = kb.models.BertBackbone(50, 1, 2, 8, 16, max_sequence_length=8, dropout=0.1)
            clf = kb.tasks.TextClassifier(backbone, num_classes=2)
        clf.compile(learning_rate=1e-2)
        return clf

    mode = "full"
    if keras.backend.backend() != "torch":
        with pytest.raises(ValueError, match=r"RematScope\(mode='full'\).*TextClassifier"):
            classifier("full").fit(x, y, verbose=0)
        mode = "activations"
    clf = classifier(mode)
    before = [to_numpy(w) for w in clf.trainable_weights]
    loss = clf.fit(x, y, epochs=2, verbose=0).history["loss"]
    assert np.isfinite(loss).all(), loss
    assert all(not np.array_equal(b, to_numpy(w)) for b, w in zip(before, clf.trainable_weights))


def test_a_fit_of_known_length_after_one_of_unknown_length_trains_on_its_own_schedule():
    """A fit of unknown length leaves the auto schedule unfilled (a constant rate); the next
    fit of known length fills it (here: 2 steps in all, so a rate of 0 from step 2 on). Its
    train step must be the filled schedule's: the first fit's traced (JAX: jitted) step, kept,
    trained on at the constant rate (every weight moved on TensorFlow and JAX)."""
    ids = np.random.RandomState(0).randint(5, 50, (4, 8)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": ids, "padding_mask": np.ones_like(ids)}, np.array([0, 1, 1, 0]))).batch(2)
    backbone = kb.models.BertBackbone(50, 1, 2, 8, 16, max_sequence_length=8)
    clf = kb.tasks.TextClassifier(backbone, num_classes=2)
    clf.compile(learning_rate=1e-2)  # the auto schedule
    clf.fit(ds.filter(lambda x, y: True), verbose=0)  # of unknown length: 2 steps
    assert clf.optimizer._learning_rate.total_steps is None
    before = [to_numpy(w) for w in clf.trainable_weights]
    clf.fit(ds, verbose=0)
    assert clf.optimizer._learning_rate.total_steps == 2
    for b, w in zip(before, clf.trainable_weights):
        np.testing.assert_array_equal(to_numpy(w), b, err_msg=w.path)


def test_adamw_config_keeps_its_weight_decay_exclusions():
    """Keras' optimizers leave `exclude_from_weight_decay` out of their config: the tasks'
    AdamW reloaded from a `.keras` file decayed LayerNorm and bias weights too."""
    optimizer = kb.tasks.AdamW(weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_names=["layer_norm", "bias"])
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(optimizer))
    assert isinstance(again, kb.tasks.AdamW)
    bias, kernel = keras.Variable(np.zeros(3), name="bias"), keras.Variable(np.zeros(3),
                                                                             name="kernel")
    assert not again._use_weight_decay(bias)
    assert again._use_weight_decay(kernel)


def test_first_fit_traces_once_after_the_preprocessor_is_detached(bert_vocab):
    """`task.preprocessor = None` (keras-hub's way to feed preprocessed features): Keras keeps
    tracking the detached preprocessor, whose tokenizer is never built. The optimizer's slots
    must still exist before the step is traced (else the step is traced twice, every slot
    initializer under a `tf.cond`)."""
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)
    backbone = kb.models.BertBackbone(**TINY)
    preprocessor = kb.tasks.TextClassifier.default_preprocessor(tokenizer, backbone,
                                                                sequence_length=16)
    classifier = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    classifier.compile(learning_rate=1e-3)
    classifier.preprocessor = None
    traces, train_step = [], classifier.train_step
    classifier.train_step = lambda *args: traces.append(1) or train_step(*args)
    x, _, _ = _preprocessed(batch=4, length=16)
    del x["mask_positions"]
    classifier.fit(x, np.array([0, 1, 0, 1]), batch_size=4, epochs=2, verbose=0)
    del classifier.train_step
    expected = 2 if keras.backend.backend() == "torch" else 1
    assert len(traces) == expected, f"the train step ran {len(traces)} times, not {expected}"


def test_task_keyword_arguments_are_checked_and_a_frozen_backbone_stays_frozen(tmp_path):
    """keras.Model's functional constructor dropped a task's unknown keyword arguments silently:
    `num_clases=3` built 2 classes, `activation="softmax"` (keras-hub's TextClassifier's, which
    ours takes) on another task still returned logits, `dtype="bfloat16"` a float32 task.
    Unknown names are a TypeError naming them; `dtype` must
    be the backbone's policy (`from_preset(..., dtype=)` builds the backbone with it). And a
    task's `trainable=True` in its config unfroze a frozen backbone on JAX and torch when it
    was rebuilt (`from_config`, `load_model`)."""
    backbone = kb.models.BertBackbone(100, 1, 2, 8, 16, max_sequence_length=16)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['num_clases'\]"):
        kb.tasks.TextClassifier(backbone, num_clases=3)
    with pytest.raises(TypeError, match=r"\['activation'\] \(the task returns logits"):
        kb.tasks.TokenClassifier(backbone, num_classes=3, activation="softmax")
    with pytest.raises(TypeError, match=r"\['mask_selection_rate'\]"):
        kb.tasks.MaskedLM(backbone, mask_selection_rate=0.2)
    with pytest.raises(ValueError, match=r"dtype='bfloat16'.*'float32'"):
        kb.tasks.TextClassifier(backbone, dtype="bfloat16")
    assert kb.tasks.TextClassifier(backbone, dtype="float32", name="clf").name == "clf"
    half = kb.tasks.MaskedLM.from_preset("bert_tiny_en_uncased", load_weights=False,
                                         dtype="mixed_bfloat16", preprocessor=None)
    assert half.backbone.dtype_policy.name == "mixed_bfloat16"

    clf = kb.tasks.TextClassifier(backbone, num_classes=2)
    clf.backbone.trainable = False
    assert len(clf.trainable_weights) == 2  # the head's kernel and bias
    again = kb.tasks.TextClassifier.from_config(clf.get_config())
    assert not again.backbone.trainable and len(again.trainable_weights) == 2
    clf.save(str(tmp_path / "frozen.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "frozen.keras"))
    assert not loaded.backbone.trainable and len(loaded.trainable_weights) == 2


@pytest.fixture(scope="module")
def _small_bert_tasks():
    """One `BertBackbone(100, 1, 2, 8, 16)` and a MaskedLM, a TextClassifier (2 classes) and a
    BertPretrainer on it (`preprocessor=None`), compiled with the tasks' defaults, their
    optimizers built (every variable a test can change exists before the first test)."""
    keras.utils.set_random_seed(1234)
    backbone = kb.models.BertBackbone(100, 1, 2, 8, 16, max_sequence_length=16)
    tasks = {"mlm": kb.tasks.MaskedLM(backbone, preprocessor=None),
             "clf": kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None),
             "pretrainer": kb.tasks.BertPretrainer(backbone, preprocessor=None)}
    for task in tasks.values():
        task.compile()
        task.optimizer.build(task.trainable_variables)
    return tasks


@pytest.fixture
def small_bert(_small_bert_tasks):
    """The input-check tests' tasks: each test refuses bad inputs and fits good ones, so the
    tasks are built and their steps traced (compiled on JAX) once for all of them, not once a
    test. Each test gets the weights and optimizer state the tasks had before it (restored
    after it); none changes what is trainable (a Distiller freezes its teacher: it gets its own
    backbone)."""
    tasks = _small_bert_tasks
    variables = {id(v): v for task in tasks.values()
                 for v in task.weights + task.optimizer.variables}.values()
    saved = [(v, to_numpy(v)) for v in variables]
    trainable = [len(task.trainable_weights) for task in tasks.values()]
    yield tasks
    for v, value in saved:
        v.assign(value)
    assert [len(task.trainable_weights) for task in tasks.values()] == trainable


def test_steps_per_execution_never_reads_past_the_data():
    """Keras runs whole executions of `steps_per_execution` steps; on our repeated pipelines
    (one iterator a fit) the last one of an epoch read the next epoch's batches: 5 batches at
    2 a run trained 6 steps, and evaluate / predict scored 6 batches. A fit whose epoch it does
    not divide is refused; evaluate and predict read the data once, as Keras does arrays."""
    backbone = kb.models.BertBackbone(100, 1, 2, 8, 16, max_sequence_length=16)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefgh")
    pre = kb.preprocessing.finetuning.TextClassifierPreprocessor(
        kb.preprocessing.WordPieceTokenizer(vocabulary=vocab), 8)
    x, y = ["a b", "c", "d e f", "g", "h a", "b c"], np.array([1, 0, 1, 0, 1, 0])
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre)
    clf.compile(steps_per_execution=1)
    once = clf.evaluate(x[:5], y[:5], batch_size=1, return_dict=True, verbose=0)
    expected = clf.predict(x[:5], batch_size=1, verbose=0)
    if keras.backend.backend() == "torch":
        return  # Keras' torch trainer takes steps_per_execution=1 only
    clf.compile(steps_per_execution=2)
    got = clf.evaluate(x[:5], y[:5], batch_size=1, return_dict=True, verbose=0)
    assert got["loss"] == pytest.approx(once["loss"], rel=1e-5)
    np.testing.assert_allclose(clf.predict(x[:5], batch_size=1, verbose=0), expected, atol=1e-5)
    clf.fit(x, y, batch_size=1, epochs=2, verbose=0)
    assert int(keras.ops.convert_to_numpy(clf.optimizer.iterations)) == 12
    with pytest.raises(ValueError, match="steps_per_execution=2 does not divide the 5 batches"):
        clf.fit(x[:5], y[:5], batch_size=1, verbose=0)


def test_model_inputs_mask_positions_and_lengths_are_checked_in_memory_and_in_datasets(
        small_bert):
    """`preprocessor=None`: a MaskedLM's `mask_positions` outside the rows were gathered clamped
    on JAX (NaN losses), wrapped on torch (a wrong finite loss), an error of TF's own on TF;
    rows longer than the position table in a `tf.data` dataset met a slice or Pad error deep in
    the model. Both are refused naming the values, in memory and in the input pipeline."""
    mlm = small_bert["mlm"]
    x = {"token_ids": np.full((2, 8), 5, "int32"), "segment_ids": np.zeros((2, 8), "int32"),
         "padding_mask": np.ones((2, 8), "int32"), "mask_positions": np.array([[1, 40], [2, 3]])}
    y, w = np.array([[5, 6], [7, 8]]), np.ones((2, 2), "float32")
    with pytest.raises(ValueError, match=r"mask_positions from 1 to 40 for rows of 8 positions"):
        mlm.fit(x, y, sample_weight=w, verbose=0)
    data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(2)
    with pytest.raises(Exception, match=r"mask_positions from 1 to 40 in a batch of rows of 8"):
        mlm.fit(data, verbose=0)
    mlm.fit(dict(x, mask_positions=np.array([[1, 7], [0, 3]])), y, sample_weight=w, verbose=0)

    clf = small_bert["clf"]
    long = {k: np.ones((2, 20), "int32") for k in ("token_ids", "segment_ids", "padding_mask")}
    labels = np.array([0, 1])
    message = r"token_ids of 20 positions.*max_sequence_length=16"
    with pytest.raises(ValueError, match=message):  # a static length: before any tracing
        clf.fit(tf.data.Dataset.from_tensor_slices((long, labels)).batch(2), verbose=0)
    unknown = tf.data.Dataset.from_generator(
        lambda: iter([(long, labels)]), output_signature=(
            {k: tf.TensorSpec([None, None], tf.int32) for k in long},
            tf.TensorSpec([None], tf.int64)))
    with pytest.raises(Exception, match=message):  # in the input pipeline
        clf.fit(unknown, verbose=0)


def test_label_ids_outside_the_vocabulary_or_the_pair_classes_are_refused(small_bert):
    """`preprocessor=None`: a MaskedLM's label ids (`y`, the target ids at the mask positions)
    outside the vocabulary gave a NaN or wrong finite loss on JAX (its gather is clamped), a
    graph error of TF's own on TF; a pretrainer's NSP / SOP labels outside {0, 1} likewise.
    Refused naming the value, its position and the valid range: in memory (fit, evaluate,
    validation data, `*_on_batch`) and in a dataset's input pipeline."""
    mlm = small_bert["mlm"]
    x = {"token_ids": np.full((2, 8), 5, "int32"), "segment_ids": np.zeros((2, 8), "int32"),
         "padding_mask": np.ones((2, 8), "int32"), "mask_positions": np.array([[1, 4], [2, 3]])}
    good, w = np.array([[5, 6], [7, 8]]), np.ones((2, 2), "float32")
    vocabulary = r"expected ids in \[0, 100\) \(BertBackbone's vocabulary_size\)"
    bad = np.array([[5, 6], [7, 100]])
    message = r"MaskedLM got label mask_ids 100 at mask_ids\[1, 1\]: " + vocabulary
    for call in (lambda: mlm.fit(x, bad, sample_weight=w, verbose=0),
                 lambda: mlm.evaluate(x, bad, verbose=0),
                 lambda: mlm.fit(x, good, validation_data=(x, bad), verbose=0),
                 lambda: mlm.train_on_batch(x, bad),
                 lambda: mlm.test_on_batch(x, bad)):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match=r"got label mask_ids -100 at mask_ids\[0, 0\]: "
                                         + vocabulary + r"\. A label to ignore takes weight 0"):
        mlm.fit(x, np.array([[-100, 6], [7, 8]]), verbose=0)
    data = tf.data.Dataset.from_tensor_slices((x, bad, w)).batch(2)
    with pytest.raises(Exception, match=r"MaskedLM got label mask_ids 100 at mask_ids\[1, 1\] "
                                        r"of a batch: " + vocabulary):
        mlm.fit(data, verbose=0)
    history = mlm.fit(x, good, sample_weight=w, verbose=0).history
    assert np.isfinite(history["loss"]).all()

    pretrainer = small_bert["pretrainer"]
    y = {"mask_ids": good, "mask_weights": w, "pair_labels": np.array([0, 2])}
    with pytest.raises(ValueError, match=r"BertPretrainer got label pair_labels 2 at "
                                         r"pair_labels\[1\]: expected labels in \[0, 2\) "
                                         r"\(the nsp head's two classes\)"):
        pretrainer.fit(x, y, verbose=0)
    with pytest.raises(ValueError, match=r"BertPretrainer got label mask_ids 100 at "
                                         r"mask_ids\[1, 1\]: " + vocabulary):
        pretrainer.fit(x, dict(y, mask_ids=bad, pair_labels=np.array([0, 1])), verbose=0)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    with pytest.raises(Exception, match=r"got label pair_labels 2 at pair_labels\[1\] of a "
                                        r"batch: expected labels in \[0, 2\)"):
        pretrainer.fit(data, verbose=0)

    span = kb.tasks.SpanBertPretrainer(
        kb.models.SpanBertBackbone(100, 1, 2, 8, 16, max_sequence_length=16), preprocessor=None)
    features = dict(x, span_starts=x["mask_positions"], span_ends=x["mask_positions"])
    with pytest.raises(ValueError, match=r"SpanBertPretrainer got label mask_ids 100 at "
                                         r"mask_ids\[1, 1\]: expected ids in \[0, 100\) "
                                         r"\(SpanBertBackbone's vocabulary_size\)"):
        span.fit(features, bad, verbose=0)
    with pytest.raises(ValueError, match=r"SpanBertPretrainer got label mask_ids 100"):
        span.fit(features, {"mask_ids": bad, "mask_weights": w}, verbose=0)

    # ELECTRA's generator, XLNet's permutation LM and the Distiller predict vocabulary ids too
    electra = kb.tasks.ElectraPretrainer(
        discriminator=kb.models.ElectraBackbone(100, 1, 2, 8, 8, 16, max_sequence_length=16),
        preprocessor=None)
    xlnet = kb.tasks.XLNetPretrainer(kb.models.XLNetBackbone(100, 1, 2, 8, 16),
                                     preprocessor=None)
    teacher = kb.models.BertBackbone(100, 1, 2, 8, 16, max_sequence_length=16)  # frozen by it
    distiller = kb.tasks.Distiller(kb.tasks.MaskedLM(teacher, preprocessor=None),
                                   kb.models.BertBackbone(100, 1, 2, 8, 16,
                                                          max_sequence_length=16),
                                   preprocessor=None)
    for task, key in ((electra, "mask_ids"), (xlnet, "target"), (distiller, "mask_ids")):
        with pytest.raises(ValueError, match=rf"{type(task).__name__} got label {key} 100 at "
                                             rf"{key}\[1, 1\]: expected ids in \[0, 100\)"):
            task.train_on_batch(x, bad)


def test_a_datasets_checks_are_traced_once_per_task_and_what_they_read(small_bert, monkeypatch):
    """A dataset's checks (`Task._checked_features`: ids, masks and positions, `check_ids`;
    label ids, `check_label_ids`) are one function traced once per task (`traced_once`): each
    fit's, evaluate's and predict's pipeline traced them again. A second fit, an evaluate and a
    predict on the same spec trace none, and still refuse a bad id; the backbone's vocabulary
    size changed since traces them again (the new bound refuses what the old one let pass)."""
    from keras_bertfam.tasks import task as task_module

    runs = python_runs(monkeypatch, (task_module, "check_ids"),
                       (task_module, "check_label_ids"))
    ids, labels = "keras_bertfam.tasks.task.check_ids", "keras_bertfam.tasks.task.check_label_ids"
    mlm = small_bert["mlm"]
    x = {"token_ids": np.full((2, 8), 5, "int32"), "segment_ids": np.zeros((2, 8), "int32"),
         "padding_mask": np.ones((2, 8), "int32"), "mask_positions": np.array([[1, 4], [2, 3]])}
    y, w = np.array([[5, 6], [7, 8]]), np.ones((2, 2), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(2)
    mlm.fit(data, verbose=0)
    assert runs == {ids: 1, labels: 1}
    mlm.fit(data, verbose=0)
    mlm.evaluate(data, verbose=0)
    assert mlm.predict(data, verbose=0).shape == (2, 2, 100)
    bad = tf.data.Dataset.from_tensor_slices((dict(x, token_ids=x["token_ids"] * 20), y, w))
    with pytest.raises(Exception, match=r"MaskedLM got token_ids 100 at token_ids\[0, 0\] of a "
                                        r"batch: expected ids in \[0, 100\)"):
        mlm.fit(bad.batch(2), verbose=0)
    assert runs == {ids: 1, labels: 1}
    monkeypatch.setattr(mlm.backbone, "vocabulary_size", 6)
    with pytest.raises(Exception, match=r"MaskedLM got label mask_ids 6 at mask_ids\[0, 1\] of a "
                                        r"batch: expected ids in \[0, 6\)"):
        mlm.fit(data, verbose=0)
    assert runs == {ids: 2, labels: 2}


def test_masked_lm_label_ids_from_python_generators_are_checked(small_bert):
    """A MaskedLM's label ids from a Python generator (`preprocessor=None`) are checked as they
    are read (NaN on JAX before). Token ids from every input form: below."""
    good = {"token_ids": np.full((2, 8), 5, "int32"), "padding_mask": np.ones((2, 8), "int32")}
    mlm = small_bert["mlm"]
    x = dict(good, segment_ids=np.zeros((2, 8), "int32"), mask_positions=np.array([[1, 2]] * 2))
    with pytest.raises(ValueError, match=r"MaskedLM got label mask_ids 100 at mask_ids\[0, 1\]"):
        mlm.fit(((x, np.array([[5, 100], [5, 6]])) for _ in range(1)), verbose=0)


def test_model_inputs_from_generators_py_datasets_and_torch_data_loaders_are_checked(
        small_bert):
    """`preprocessor=None` inputs from a Python generator, a `keras.utils.PyDataset` or a torch
    `DataLoader` (Keras' fit takes each on every backend) passed unchecked: token ids outside the
    vocabulary gave NaN on JAX, a graph error of TF's own on TF; a MaskedLM's label ids and a
    pretrainer's pair labels likewise. Each batch is checked as it is read, as in-memory inputs
    are; in fit, evaluate, predict and fit's validation data."""
    import torch

    clf = small_bert["clf"]
    good = {"token_ids": np.full((2, 8), 5, "int32"), "padding_mask": np.ones((2, 8), "int32")}
    bad = dict(good, token_ids=np.full((2, 8), 999, "int32"))
    labels = np.array([0, 1])
    message = (r"TextClassifier got token_ids from 999 to 999: expected ids in \[0, 100\) "
               r"\(BertBackbone's vocabulary_size\)")

    class Batches(keras.utils.PyDataset):
        def __init__(self, *batches, labelled=True):
            super().__init__()
            self.batches, self.labelled = batches, labelled

        def __len__(self):
            return len(self.batches)

        def __getitem__(self, i):
            return (self.batches[i], labels) if self.labelled else (self.batches[i],)

    def loader(*xs, labelled=True):  # examples, batched by torch's default collate
        examples = [({k: torch.as_tensor(v[i]) for k, v in x.items()}, int(labels[i]))
                    for x in xs for i in range(2)]
        if not labelled:
            examples = [example[:1] for example in examples]
        return torch.utils.data.DataLoader(examples, batch_size=2)

    def generator(*xs, labelled=True):
        for x in xs:
            yield (x, labels) if labelled else (x,)

    for data in (generator, Batches, loader):
        for call in (lambda: clf.fit(data(bad), verbose=0),
                     lambda: clf.fit(data(good, good, bad), verbose=0),  # a later batch
                     lambda: clf.evaluate(data(bad), verbose=0),
                     lambda: clf.predict(data(bad, labelled=False), verbose=0),
                     lambda: clf.fit(good, labels, validation_data=data(bad), verbose=0)):
            with pytest.raises(ValueError, match=message):
                call()
        epochs = 1 if data is generator else 2  # a generator is read once
        history = clf.fit(data(good, good), epochs=epochs, verbose=0).history
        assert np.isfinite(history["loss"]).all() and len(history["loss"]) == epochs
        assert clf.predict(data(good, labelled=False), verbose=0).shape == (2, 2)

    pretrainer = small_bert["pretrainer"]
    x = dict(good, segment_ids=np.zeros((2, 8), "int32"), mask_positions=np.array([[1, 2]] * 2))
    y = {"mask_ids": np.array([[5, 6], [7, 8]]), "mask_weights": np.ones((2, 2), "float32"),
         "pair_labels": np.array([0, 2])}

    class Pretraining(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return x, y

    with pytest.raises(ValueError, match=r"BertPretrainer got label pair_labels 2 at "
                                         r"pair_labels\[1\]: expected labels in \[0, 2\)"):
        pretrainer.fit(Pretraining(), verbose=0)
    mlm = small_bert["mlm"]
    examples = [({k: torch.as_tensor(v[i]) for k, v in x.items()}, torch.as_tensor(t))
                for i, t in enumerate(np.array([[5, 6], [7, 100]]))]
    with pytest.raises(ValueError, match=r"MaskedLM got label mask_ids 100 at mask_ids\[1, 1\]: "
                                         r"expected ids in \[0, 100\)"):
        mlm.fit(torch.utils.data.DataLoader(examples, batch_size=2), verbose=0)


def test_mask_values_other_than_0_or_1_are_refused_on_every_backend(small_bert):
    """`preprocessor=None`: a Longformer task's padding_mask holding 2 (HF's global token) or a
    global_attention_mask holding -1 (HF's padding) trained and predicted silently on JAX (its
    jitted step cannot raise; TensorFlow's graph stopped, in the backbone); any family's
    padding_mask of 2 or -1 was read as 1 everywhere. Masks hold 0 and 1 only, checked where
    ids are, naming the input, the value and its position: in memory (fit, predict, evaluate,
    validation data, `*_on_batch`), in a dataset's pipeline, and batch by batch from a Python
    generator, a PyDataset and a torch DataLoader."""
    import torch

    longformer = kb.models.LongformerBackbone(100, 1, 2, 16, 32, max_sequence_length=16,
                                              attention_window=4)
    bert = small_bert["clf"].backbone
    good = {"token_ids": np.full((2, 8), 5, "int32"), "segment_ids": np.zeros((2, 8), "int32"),
            "padding_mask": np.ones((2, 8), "int32")}
    labels = np.array([0, 1])

    class Batches(keras.utils.PyDataset):
        def __init__(self, x):
            super().__init__()
            self.x = x

        def __len__(self):
            return 1

        def __getitem__(self, i):
            return self.x, labels

    def loader(x):
        return torch.utils.data.DataLoader(
            [({k: torch.as_tensor(v[i]) for k, v in x.items()}, int(labels[i])) for i in (0, 1)],
            batch_size=2)

    longformer_clf = kb.tasks.TextClassifier(longformer, num_classes=2, preprocessor=None)
    for backbone, value in ((longformer, 2), (longformer, -1), (bert, 2)):
        clf = longformer_clf if backbone is longformer else small_bert["clf"]
        mask = good["padding_mask"].copy()
        mask[1, 1] = value
        bad = dict(good, padding_mask=mask)
        message = (rf"TextClassifier got padding_mask {value} at padding_mask\[1, 1\]"
                   r"{}: expected 0 and 1 only \(1: a token, 0: padding\)\.")
        if backbone is longformer:  # (HF's hint, on every path a Longformer refuses it)
            message += re.escape(" HF's attention_mask of 2 (a global token) is "
                                 "global_attention_mask=1 here.")
        for call in (lambda: clf.fit(bad, labels, verbose=0),
                     lambda: clf.predict(bad, verbose=0),
                     lambda: clf.evaluate(bad, labels, verbose=0),
                     lambda: clf.fit(good, labels, validation_data=(bad, labels), verbose=0),
                     lambda: clf.train_on_batch(bad, labels),
                     lambda: clf.predict_on_batch(bad),
                     lambda: clf.fit(((bad, labels) for _ in range(1)), verbose=0),
                     lambda: clf.fit(Batches(bad), verbose=0),
                     lambda: clf.fit(loader(bad), verbose=0)):
            with pytest.raises(ValueError, match=message.format("")):
                call()
        data = tf.data.Dataset.from_tensor_slices((bad, labels)).batch(2)
        with pytest.raises(Exception, match=message.format(" of a batch")):
            # fit traces a train step before its pipeline stops; the pipeline's check is the
            # one `predict` runs: fit for the first case, predict (no train step) for the rest
            (clf.fit if backbone is longformer and value == 2 else clf.predict)(data, verbose=0)
    half = np.ones((2, 8), "float32")
    half[0, 2] = 0.5  # in [0, 1], but not a mask value
    with pytest.raises(ValueError, match=r"got padding_mask 0.5 at padding_mask\[0, 2\]"):
        clf.predict(dict(good, padding_mask=half), verbose=0)
    history = clf.fit(good, labels, verbose=0).history  # 0 / 1 masks train
    clf.predict(dict(good, padding_mask=good["padding_mask"] == 1), verbose=0)  # bool: a mask
    assert np.isfinite(history["loss"]).all()

    # a Distiller of Longformers takes global_attention_mask as an input
    distiller = kb.tasks.Distiller(kb.tasks.MaskedLM(longformer, preprocessor=None),
                                   kb.models.LongformerBackbone(100, 1, 2, 16, 32,
                                                                max_sequence_length=16,
                                                                attention_window=4),
                                   preprocessor=None)
    glob = np.zeros((2, 8), "int32")
    glob[0, 3] = -1
    x = dict(good, global_attention_mask=glob, mask_positions=np.array([[1, 2]] * 2))
    y = {"mask_ids": np.array([[5, 6], [7, 8]]), "mask_weights": np.ones((2, 2), "float32")}
    message = (r"Distiller got global_attention_mask -1 at global_attention_mask\[0, 3\]{}: "
               r"expected 0 and 1 only \(1: global attention on a token, 0: local\)")
    with pytest.raises(ValueError, match=message.format("")):
        distiller.fit(x, y, verbose=0)
    # predict: the dataset check fit runs (the same map), without tracing a train step
    with pytest.raises(Exception, match=message.format(" of a batch")):
        distiller.predict(tf.data.Dataset.from_tensor_slices((x, y)).batch(2), verbose=0)


def _bad_mask_cases():
    """The backbone mask test's cases: (backbone compiled with an MSE loss, good inputs, bad
    inputs, targets y, the refusal's message as a regex) for a Longformer's padding_mask of 2
    (with HF's attention_mask hint) and global_attention_mask of -1, and a BERT's padding_mask
    of 2, each at [1, 1]."""
    longformer = kb.models.LongformerBackbone(100, 1, 2, 16, 32, max_sequence_length=16,
                                              attention_window=4)
    bert = kb.models.BertBackbone(100, 1, 2, 8, 16, max_sequence_length=16)
    good = {"token_ids": np.full((2, 8), 5, "int32"), "padding_mask": np.ones((2, 8), "int32")}
    hint = " HF's attention_mask of 2 (a global token) is global_attention_mask=1 here."
    for backbone, key, value, ends in ((longformer, "padding_mask", 2, hint),
                                       (longformer, "global_attention_mask", -1, ""),
                                       (bert, "padding_mask", 2, "")):
        size = backbone.hidden_dim
        y = {"sequence_output": np.zeros((2, 8, size), "float32"),
             "pooled_output": np.zeros((2, size), "float32")}
        backbone.compile(optimizer="sgd", loss="mse")
        mask = np.zeros((2, 8), "int32") if key == "global_attention_mask" else np.ones((2, 8),
                                                                                         "int32")
        mask[1, 1] = value
        message = re.escape(f"{type(backbone).__name__} got {key} {value} at {key}[1, 1]: "
                            f"expected 0 and 1 only ({kb.models.input_checks.MASK_INPUTS[key]})."
                            f"{ends}")
        yield backbone, good, dict(good, **{key: mask}), y, message


def test_a_backbones_own_entry_points_refuse_mask_values_other_than_0_or_1():
    """In memory: a backbone's own `predict` (and `*_on_batch`, `fit`, `evaluate`, an eager
    call) took a padding_mask of 2 silently where a task refuses it: a Longformer's on JAX (its
    jitted step cannot raise; HF reads 2 as a global token), a BERT's on every backend (read as
    1). They refuse it now with the tasks' message, on every backend (a Longformer's
    padding_mask with HF's attention_mask hint, which its eager call had lost); 0 / 1 masks
    still run.

    In datasets and streams (the same backbones: their steps traced once for both): a
    backbone's own `predict`, `fit` (and its validation data) and `evaluate` given a
    `tf.data.Dataset`, a generator, a PyDataset or a torch DataLoader took a padding_mask of 2
    silently: a BERT's on every backend but torch (its eager step calls the backbone, which
    checks), a Longformer's on JAX (its jitted step cannot raise). Each batch is checked now as
    it is read, with the in-memory message (a Longformer's with HF's attention_mask hint)."""
    import torch

    cases = list(_bad_mask_cases())
    for backbone, good, bad, y, message in cases:
        tensors = {k: keras.ops.convert_to_tensor(v) for k, v in bad.items()}
        for call in (lambda: backbone.predict(bad, verbose=0),
                     lambda: backbone.predict_on_batch(bad),
                     lambda: backbone(bad),
                     lambda: backbone(tensors),
                     lambda: backbone.fit(bad, y, verbose=0),
                     lambda: backbone.fit(good, y, validation_data=(bad, y), verbose=0),
                     lambda: backbone.evaluate(bad, y, verbose=0),
                     lambda: backbone.train_on_batch(bad, y),
                     lambda: backbone.test_on_batch(bad, y)):
            with pytest.raises(ValueError, match=message):
                call()
        out = backbone.predict(good, verbose=0)  # 0 / 1 masks run
        np.testing.assert_allclose(to_numpy(backbone(good)["sequence_output"]),
                                   out["sequence_output"], atol=1e-5)
        assert np.isfinite(backbone.fit(good, y, verbose=0).history["loss"]).all()

    for backbone, good, bad, y, message in cases:

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return 1

            def __getitem__(self, i):
                return bad, y

        rows = [({k: torch.as_tensor(v[i]) for k, v in bad.items()},
                 {k: torch.as_tensor(v[i]) for k, v in y.items()}) for i in (0, 1)]
        data = tf.data.Dataset.from_tensor_slices((bad, y)).batch(2)
        calls = [lambda: backbone.predict(tf.data.Dataset.from_tensor_slices(bad).batch(2),
                                          verbose=0)]
        if type(backbone) is kb.models.BertBackbone:  # every entry point and kind of data
            # (one mechanism: cheap here)
            calls += [lambda: backbone.evaluate(data, verbose=0),
                      lambda: backbone.fit(data, verbose=0),
                      lambda: backbone.fit(good, y, validation_data=data, verbose=0),
                      lambda: backbone.fit(((bad, y) for _ in range(1)), verbose=0),
                      lambda: backbone.fit(Batches(), verbose=0),
                      lambda: backbone.fit(torch.utils.data.DataLoader(rows, batch_size=2),
                                           verbose=0)]
        for call in calls:
            with pytest.raises(ValueError, match=message):
                call()
    bert = backbone  # the last case's
    good_data = tf.data.Dataset.from_tensor_slices((good, y)).batch(2)
    assert np.isfinite(bert.fit(good_data, verbose=0).history["loss"]).all()  # 0 / 1 masks run
    np.testing.assert_allclose(bert.predict(good_data, verbose=0)["pooled_output"],
                               to_numpy(bert(good)["pooled_output"]), atol=1e-5)


def test_evaluate_gives_the_metric_of_the_whole_data_whatever_the_batching():
    """Tracked metrics are weighted means (real tokens, masked slots, sample weights); the
    epoch's mean weighted each batch by its rows, so a token accuracy of 0.20 read 0.22 at batch
    size 1 and 2, and a batch with 1 masked slot counted as much as one with 3. Each batch now
    counts for what its mean is over (`Task.metric_weights`)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    backbone = kb.models.BertBackbone(50, 1, 2, 8, 16, max_sequence_length=16)
    ids = rng.integers(5, 50, (4, 8)).astype("int32")
    mask = np.ones_like(ids)
    mask[2:, 2:] = 0
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}

    def evaluate(task, x, y, w, key):
        return [task.evaluate(x, y, sample_weight=w, batch_size=b, verbose=0,
                              return_dict=True)[key] for b in (1, 2, 4)]

    tagger = kb.tasks.TokenClassifier(backbone, num_classes=3, preprocessor=None)
    tagger.compile()
    labels, weights = rng.integers(0, 3, (4, 8)), mask.astype("float32")
    right = np.argmax(to_numpy(tagger.predict(x, verbose=0)), -1) == labels
    np.testing.assert_allclose(evaluate(tagger, x, labels, weights, "accuracy"),
                               (right * weights).sum() / weights.sum(), rtol=1e-5)

    mlm = kb.tasks.MaskedLM(backbone, preprocessor=None)
    mlm.compile()
    xm = dict(x, mask_positions=np.tile([[1, 2, 3]], (4, 1)))
    targets, slots = rng.integers(5, 50, (4, 3)), np.array(
        [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], "float32")
    right = np.argmax(to_numpy(mlm.predict(xm, verbose=0)), -1) == targets
    np.testing.assert_allclose(evaluate(mlm, xm, targets, slots, "mlm_accuracy"),
                               (right * slots).sum() / slots.sum(), rtol=1e-5)

    classifier = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None)
    classifier.compile()
    labels, weights = np.array([0, 1, 1, 0]), np.array([1.0, 0.0, 0.0, 3.0], "float32")
    right = np.argmax(to_numpy(classifier.predict(x, verbose=0)), -1) == labels
    np.testing.assert_allclose(evaluate(classifier, x, labels, weights, "accuracy"),
                               (right * weights).sum() / weights.sum(), rtol=1e-5)


def _tiny_backbone(vocabulary_size=30522):  # (the WordPiece vocabulary of `bert_vocab`)
    return kb.models.BertBackbone(vocabulary_size, 1, 2, 8, 16, max_sequence_length=16,
                                  dropout=0.0)


def test_token_labels_below_zero_are_ignored_as_hfs_minus_100():
    """HF's preprocessed token labels mark special tokens, later pieces and padding with -100
    (CrossEntropyLoss' ignore_index): the loss and accuracy are means over the labels >= 0.
    The loss weighted them as labels: a clamped gather on JAX / PyTorch (silently wrong), an
    "outside the valid range" error on TensorFlow, even with sample_weight=(y >= 0)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, (4, 8)).astype("int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    y = rng.integers(0, 3, (4, 8)).astype("int32")
    y[:, 0] = y[:, 3] = y[:, -1] = -100
    tagger = kb.tasks.TokenClassifier(_tiny_backbone(50), num_classes=3, preprocessor=None)
    tagger.compile()
    logits = to_numpy(tagger.predict(x, verbose=0)).astype("float64")
    valid = y >= 0
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_p, np.where(valid, y, 0)[..., None], -1)[..., 0]
    right = logits.argmax(-1) == y
    for weights in (None, valid.astype("float32")):
        for batch_size in (1, 4):
            got = tagger.evaluate(x, y, sample_weight=weights, batch_size=batch_size, verbose=0,
                                  return_dict=True)
            np.testing.assert_allclose(got["loss"], ce[valid].mean(), rtol=1e-4)
            np.testing.assert_allclose(got["accuracy"], right[valid].mean(), rtol=1e-5)


def _tagger(bert_vocab, length=8, **kwargs):
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    preprocessor = kb.preprocessing.TokenClassifierPreprocessor(tokenizer, length)
    return kb.tasks.TokenClassifier(_tiny_backbone(), num_classes=3, preprocessor=preprocessor,
                                    dropout=0.0, **kwargs)


def test_dense_token_labels_padded_with_minus_one_fit_in_memory(bert_vocab):
    """[B, W] labels padded with -1 (TokenClassifierPreprocessor's documented format, which a
    dataset took) failed in `fit` on arrays: "example 1 has 2 word(s) but 3 label(s)"."""
    tagger = _tagger(bert_vocab)
    tagger.compile()
    x = ["a b c", "d e"]
    history = tagger.fit(x, np.array([[0, 1, 2], [1, 1, -1]]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    padded = tagger.evaluate(x, np.array([[0, 1, 2], [1, 1, -1]]), verbose=0, return_dict=True)
    ragged = tagger.evaluate(x, [[0, 1, 2], [1, 1]], verbose=0, return_dict=True)
    np.testing.assert_allclose(padded["loss"], ragged["loss"], rtol=1e-6)
    with pytest.raises(ValueError, match=r"example 1 has 2 word\(s\) but 3 label\(s\)"):
        tagger.fit(x, np.array([[0, 1, 2], [1, 1, 2]]), epochs=1, verbose=0)


def test_token_classifier_takes_class_weight(bert_vocab):
    """`class_weight` weighs each token by its label's weight; Keras refused it ("You cannot
    `class_weight` and `sample_weight` at the same time": the preprocessor's token weights),
    and without a preprocessor read the token labels as one-hot rows."""
    keras.utils.set_random_seed(0)
    tagger = _tagger(bert_vocab)
    tagger.compile(optimizer=keras.optimizers.SGD(0.0))
    x, y = ["a b c", "d e"], [[0, 1, 2], [1, 1]]
    weights = {0: 1.0, 1: 3.0, 2: 0.5}
    logits = to_numpy(tagger.predict(x, verbose=0)).astype("float64")
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = np.array([-log_p[b, 1 + i, label] for b, row in enumerate(y)
                   for i, label in enumerate(row)])  # one piece a word: word i at position 1 + i
    w = np.array([weights[label] for row in y for label in row])
    history = tagger.fit(x, y, class_weight=weights, batch_size=2, epochs=1, shuffle=False,
                         verbose=0)
    np.testing.assert_allclose(history.history["loss"][0], (w * ce).sum() / w.sum(), rtol=1e-4)
    plain = tagger.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)  # not kept
    np.testing.assert_allclose(plain.history["loss"][0], ce.mean(), rtol=1e-4)
    with pytest.raises(ValueError, match=r"class_weight.*3.*num_classes=3"):
        tagger.fit(x, y, class_weight={0: 1.0, 3: 2.0}, epochs=1, verbose=0)


def test_label_matrices_are_refused_by_shape(bert_vocab):
    """Multi-label / multi-target label matrices failed inside the step ("Incompatible shapes:
    [4] vs. [12]"); string regression targets with "None values not supported"; multi-hot rows
    were advised np.argmax."""
    tokenizer = kb.preprocessing.WordPieceTokenizer(bert_vocab, lowercase=True)
    backbone = _tiny_backbone()

    def classifier(n):
        return kb.tasks.TextClassifier(backbone, num_classes=n, preprocessor=(
            kb.preprocessing.TextClassifierPreprocessor(tokenizer, 8)))

    x = ["good film", "bad plot", "dull", "fine"]
    multi_hot = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 1], [1, 1, 0]])
    for n in (2, 4):
        with pytest.raises(ValueError, match=r"shape \(4, 3\).*(?s:.*)[Mm]ulti-label"):
            classifier(n).fit(x, multi_hot, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"[Mm]ulti-label") as error:
        classifier(3).fit(x, multi_hot, epochs=1, verbose=0)
    assert "argmax" not in str(error.value)
    with pytest.raises(ValueError, match=r"argmax"):  # one-hot rows: the advice stands
        classifier(3).fit(x, np.eye(3)[[0, 1, 2, 0]], epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"one regression target per example.*shape \(4, 2\)"):
        classifier(1).fit(x, multi_hot[:, :2].astype("float32"), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"Invalid regression target '0.5'"):
        classifier(1).fit(x, ["0.5", "1", "2", "3"], epochs=1, verbose=0)
    ds = tf.data.Dataset.from_tensor_slices((x, multi_hot[:, :2])).batch(2)
    with pytest.raises(ValueError, match=r"shape \(None, 2\).*(?s:.*)[Mm]ulti-label"):
        classifier(2).fit(ds, epochs=1, verbose=0)
    choices = kb.tasks.MultipleChoice(backbone, preprocessor=kb.preprocessing.
                                      MultipleChoicePreprocessor(tokenizer, 8))
    with pytest.raises(ValueError, match=r"one choice label per example.*shape \(2, 2\)"):
        choices.fit((x[:2], [["a", "b"], ["c", "d"]]), [[1, 0], [0, 1]], epochs=1, verbose=0)
    ds = tf.data.Dataset.from_tensor_slices(
        ((x[:2], [["a", "b"], ["c", "d"]]), [[1, 0], [0, 1]])).batch(2)
    with pytest.raises(ValueError, match=r"one choice label per example.*shape \(None, 2\)"
                                         r".*tf\.argmax"):
        choices.fit(ds, epochs=1, verbose=0)
