"""A task's `fit` / `evaluate` traces its step once on TensorFlow. Keras builds nothing before
tracing there (no strategy): compiled metrics created inside the first trace made TensorFlow
trace the whole train step twice, the first `fit` of every task paying double."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="TensorFlow's tracing (JAX and torch build first)")

TEXTS = ["a good film", "a dull film", "good", "dull and long"]


def counting(task, name):
    """Counts the Python runs of `task.<name>` (train_step / test_step): one a trace."""
    calls = []
    step = getattr(task, name)

    def counted(data):
        calls.append(1)
        return step(data)

    setattr(task, name, counted)
    return calls


@pytest.fixture(scope="module")
def vocab():
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        {w for t in TEXTS for w in t.split()})


def tiny_backbone(vocab):
    return kb.models.BertBackbone(vocabulary_size=len(vocab), num_layers=1, num_heads=2,
                                  hidden_dim=8, intermediate_dim=16, max_sequence_length=16)


def classifier(vocab):
    backbone = tiny_backbone(vocab)
    pre = kb.preprocessing.TextClassifierPreprocessor(
        kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True), sequence_length=8)
    clf = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre)
    clf.compile(optimizer="adam", metrics=["accuracy"])
    return clf


def test_fit_on_raw_strings_traces_the_train_step_once(vocab):
    clf = classifier(vocab)
    traces = counting(clf, "train_step")
    created = []

    def creator(next_creator, **kwargs):
        if tf.inside_function():
            created.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        history = clf.fit(TEXTS, [1, 0, 1, 0], batch_size=2, epochs=2, verbose=0)
    assert len(traces) == 1, f"train_step traced {len(traces)} times"
    assert created == [], f"variables created while tracing: {created}"
    assert len(history.history["accuracy"]) == 2  # the metric was built and reported


def test_evaluate_before_any_fit_traces_the_test_step_once(vocab):
    clf = classifier(vocab)
    traces = counting(clf, "test_step")
    results = clf.evaluate(TEXTS, [1, 0, 1, 0], batch_size=2, verbose=0, return_dict=True)
    assert len(traces) == 1, f"test_step traced {len(traces)} times"
    assert np.isfinite(results["loss"]) and 0 <= results["accuracy"] <= 1, results


def test_fit_on_preprocessed_arrays_traces_once(vocab):
    """keras-hub's preprocessed format (preprocessor=None): the batch spec comes from Keras' own
    dataset of the arrays."""
    mlm = kb.tasks.MaskedLM(tiny_backbone(vocab), preprocessor=None)
    mlm.compile(optimizer="adam", weighted_metrics=["sparse_categorical_accuracy"])
    traces = counting(mlm, "train_step")
    x = {"token_ids": np.full((4, 8), 5, "int32"), "segment_ids": np.zeros((4, 8), "int32"),
         "padding_mask": np.ones((4, 8), "int32"), "mask_positions": np.ones((4, 2), "int32")}
    mlm.fit(x, np.full((4, 2), 6, "int32"), sample_weight=np.ones((4, 2), "float32"),
            batch_size=2, verbose=0)
    assert len(traces) == 1, f"train_step traced {len(traces)} times"


def test_a_fit_after_a_failed_one_traces_its_step_again_only_for_another_schedule(vocab):
    """The auto schedule's steps are constants of the traced train step. A fit that fails
    before its first step (a bad label in its first batch) leaves the schedule to the next fit,
    which fills it from its own length: of the same length, it keeps the failed fit's traced
    step (it was dropped: traced twice); of another, it traces it again (a stale step would
    train with the failed fit's schedule). A fit of unknown length (no total_steps yet) and then
    one of known length: traced again too (the first one's step was kept, and trained on at
    the constant rate of an unfilled schedule)."""
    clf = classifier(vocab)

    def data(labels):
        return tf.data.Dataset.from_tensor_slices((TEXTS, labels)).batch(2)  # 2 batches

    bad, good = data([7, 0, 1, 0]), data([1, 0, 1, 0])
    for epochs, traced in ((2, 1), (1, 2)):  # the failed fit's 4 steps, then 4 or 2 steps
        clf.compile(learning_rate=1e-2)  # the auto schedule
        traces = counting(clf, "train_step")
        with pytest.raises(Exception, match="Invalid label"):
            clf.fit(bad, epochs=2, verbose=0)
        assert clf.optimizer._learning_rate.total_steps is None
        clf.fit(good, epochs=epochs, verbose=0)
        assert clf.optimizer._learning_rate.total_steps == 2 * epochs
        assert len(traces) == traced, f"{epochs} epochs: train_step traced {len(traces)} times"
    clf.compile(learning_rate=1e-2)
    traces = counting(clf, "train_step")
    clf.fit(good.filter(lambda x, y: True), verbose=0)  # of unknown length: 2 steps
    assert clf.optimizer._learning_rate.total_steps is None
    clf.fit(good, verbose=0)
    assert clf.optimizer._learning_rate.total_steps == 2
    assert len(traces) == 2, f"train_step traced {len(traces)} times"
    # (That the second fit trains at its own schedule, not the stale step's constant rate, is
    # test_tasks' test_a_fit_of_known_length_after_one_of_unknown_length_..., every backend.)
