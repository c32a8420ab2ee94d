"""keras.io "Sentence embeddings using Siamese RoBERTa-networks" (examples/nlp/
sentence_embeddings_with_sbert.py), ported as a conformance test: the example's calls as written,
with only names changed (keras_hub.models.RobertaPreprocessor -> kb.preprocessing.
TextClassifierPreprocessor, RobertaBackbone -> kb.models.RobertaBackbone), data and sizes.

- Preset: "roberta_base_en" is not offline. Its stand-in is a keras-hub preset directory saved
  here by keras-hub itself: a tiny random RoBERTa (1 layer, hidden 16) and a byte-level BPE
  vocabulary of 300 trained on Rotten Tomatoes sentences. Both libraries load that directory,
  so the example's encoder can be compared with keras-hub's on the same weights.
- Data: GLUE STS-B and the Wikipedia sections triplets are not offline. Rotten Tomatoes
  sentences (kb.preprocessing.corpus) stand in for both: pairs scored 4 (same sentiment) or 1
  (opposite), in the dict layout tfds gives STS-B, and a CSV of (anchor, positive, negative)
  triplets with the columns of the example's CSV, read by its own make_csv_dataset call.
- Sizes: 2 training batches per fit (the example: 300 and 200), no validation pass (the
  example's 40 and 75 batches): see the fits.
- The example sets KERAS_BACKEND=tensorflow (string inputs inside a functional model, tf.unstack
  in its loss): TensorFlow only, as written. Its mixed_float16 policy is set for the regression
  fit, as its first line sets it for the whole run; the comparisons and the triplet fit are
  float32.

Our differences (README, "Differences from keras-hub"): the backbone returns a dict, so the
example's `backbone(x)` is read as `backbone(x)["sequence_output"]`; `padding_mask` is int32 0/1
(GlobalAveragePooling1D takes either). keras-hub 0.32 itself refuses the example's
`keras.Input(shape=(1,), dtype="string")` in its tokenizer ("rank < 2"); keras-nlp, which the
example was written for, took it, and so do we: a (batch, 1) column of strings is a batch of texts.
"""
import csv

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import to_numpy, unblock_imports

AUTOTUNE = tf.data.experimental.AUTOTUNE

# The example's inference inputs.
SENTENCES = [
    "Today is a very sunny day.",
    "I am hungry, I will get my meal.",
    "The dog is eating his food.",
]
QUESTIONS = [
    "What should I do to improve my English writting?",
    "How to be good at speaking English?",
    "How can I improve my English?",
    "How to earn money online?",
    "How do I earn money online?",
    "How to work and earn money through internet?",
]


@pytest.fixture(scope="module")
def rotten_tomatoes():
    """400 Rotten Tomatoes sentences, positive and negative in turn, and their labels (1 =
    positive)."""
    ds = kb.preprocessing.corpus.movie_reviews_sentences()
    halves = [list(ds.filter(lambda text, y: y == label).take(200).as_numpy_iterator())
              for label in (1, 0)]
    rows = [row for pair in zip(*halves) for row in pair]
    return [text.decode() for text, _ in rows], np.array([label for _, label in rows])


@pytest.fixture(scope="module")
def preset(tmp_path_factory, rotten_tomatoes):
    """A keras-hub RoBERTa preset directory, saved by keras-hub: the tiny stand-in for
    "roberta_base_en" (max_sequence_length 128: our preprocessor's default length)."""
    texts, _ = rotten_tomatoes
    vocabulary, merges = kb.preprocessing.train_byte_pair_vocabulary(texts, 300)
    path = str(tmp_path_factory.mktemp("roberta_tiny_en"))
    keras_hub.models.RobertaTokenizer(vocabulary=vocabulary, merges=merges).save_to_preset(path)
    keras_hub.models.RobertaBackbone(vocabulary_size=300, num_layers=1, num_heads=2,
                                     hidden_dim=16, intermediate_dim=32,
                                     max_sequence_length=128).save_to_preset(path)
    return path


def _stsb(rotten_tomatoes, start, count):
    """STS-B's tfds layout: {"sentence1", "sentence2", "label" (a float score in [0, 5])}."""
    texts, labels = np.array(rotten_tomatoes[0]), rotten_tomatoes[1]
    first = np.arange(start, start + count)
    second = start + count + np.random.RandomState(start).permutation(count)
    score = np.where(labels[first] == labels[second], 4.0, 1.0).astype("float32")
    return tf.data.Dataset.from_tensor_slices(
        {"sentence1": texts[first], "sentence2": texts[second], "label": score})


def _wiki_csv(path, rotten_tomatoes, start, count):
    """The Wikipedia sections triplets' CSV layout: anchor, positive (the same sentiment),
    negative (the other one)."""
    texts, labels = rotten_tomatoes
    pool = range(start + count, start + 3 * count)  # count of each label (they alternate)
    positive = [texts[j] for j in pool if labels[j] == 1]
    negative = [texts[j] for j in pool if labels[j] == 0]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Sentence1", "Sentence2", "Sentence3"])
        for k, i in enumerate(range(start, start + count)):
            same, other = (positive, negative) if labels[i] == 1 else (negative, positive)
            writer.writerow([texts[i], same[k], other[k]])
    return str(path)


def _normal_encoder(preset):
    """The example's first encoder: mean pooling over the padding mask, unit normalized."""
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset)
    backbone = kb.models.RobertaBackbone.from_preset(preset)
    inputs = keras.Input(shape=(1,), dtype="string", name="sentence")
    x = preprocessor(inputs)
    h = backbone(x)["sequence_output"]  # Difference: a dict (keras-hub: the sequence tensor)
    embedding = keras.layers.GlobalAveragePooling1D(name="pooling_layer")(
        h, x["padding_mask"]
    )
    n_embedding = keras.layers.UnitNormalization(axis=1)(embedding)
    roberta_normal_encoder = keras.Model(inputs=inputs, outputs=n_embedding)
    return roberta_normal_encoder, preprocessor, backbone


class RegressionSiamese(keras.Model):
    def __init__(self, encoder, **kwargs):
        inputs = keras.Input(shape=(2,), dtype="string", name="sentences")
        sen1, sen2 = keras.ops.split(inputs, 2, axis=1)
        u = encoder(sen1)
        v = encoder(sen2)
        cosine_similarity_scores = keras.ops.matmul(u, keras.ops.transpose(v))

        super().__init__(
            inputs=inputs,
            outputs=cosine_similarity_scores,
            **kwargs,
        )

        self.encoder = encoder

    def get_encoder(self):
        return self.encoder


class TripletSiamese(keras.Model):
    def __init__(self, encoder, **kwargs):
        anchor = keras.Input(shape=(1,), dtype="string")
        positive = keras.Input(shape=(1,), dtype="string")
        negative = keras.Input(shape=(1,), dtype="string")

        ea = encoder(anchor)
        ep = encoder(positive)
        en = encoder(negative)

        positive_dist = keras.ops.sum(keras.ops.square(ea - ep), axis=1)
        negative_dist = keras.ops.sum(keras.ops.square(ea - en), axis=1)

        positive_dist = keras.ops.sqrt(positive_dist)
        negative_dist = keras.ops.sqrt(negative_dist)

        output = keras.ops.stack([positive_dist, negative_dist], axis=0)

        super().__init__(inputs=[anchor, positive, negative], outputs=output, **kwargs)

        self.encoder = encoder

    def get_encoder(self):
        return self.encoder


class TripletLoss(keras.losses.Loss):
    def __init__(self, margin=1, **kwargs):
        super().__init__(**kwargs)
        self.margin = margin

    def call(self, y_true, y_pred):
        positive_dist, negative_dist = tf.unstack(y_pred, axis=0)

        losses = keras.ops.relu(positive_dist - negative_dist + self.margin)
        return keras.ops.mean(losses, axis=0)


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")  # the example's first line
    yield
    keras.mixed_precision.set_global_policy("float32")


def _weights(model):
    return [to_numpy(w).astype("float32") for w in model.weights]


# === "Build the encoder model": the (batch, 1) string input, against keras-hub ===


def test_encoder_on_a_string_column_equals_keras_hub_and_sentence_encoder(preset):
    roberta_normal_encoder, preprocessor, backbone = _normal_encoder(preset)
    assert roberta_normal_encoder.output.shape == (None, 16)
    sentence_embeddings = to_numpy(roberta_normal_encoder(tf.constant(SENTENCES)))
    assert sentence_embeddings.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(sentence_embeddings, axis=1), 1.0, atol=1e-5)
    # A (batch, 1) column, the Input's own shape, is the same batch of texts.
    column = tf.constant([[s] for s in SENTENCES])
    np.testing.assert_allclose(to_numpy(roberta_normal_encoder(column)), sentence_embeddings,
                               atol=1e-6)
    for key, value in preprocessor(np.array([[s] for s in SENTENCES])).items():
        np.testing.assert_array_equal(to_numpy(value), to_numpy(preprocessor(SENTENCES)[key]))

    # keras-hub on the same preset directory: the same embeddings. Its 0.32 tokenizer refuses
    # the example's (batch, 1) Input ("rank < 2"), so its encoder here takes a [batch] Input.
    hub_preprocessor = keras_hub.models.RobertaPreprocessor.from_preset(preset,
                                                                        sequence_length=128)
    hub_backbone = keras_hub.models.RobertaBackbone.from_preset(preset)
    with pytest.raises(ValueError, match="rank < 2"):
        hub_preprocessor(keras.Input(shape=(1,), dtype="string"))
    hub_inputs = keras.Input(shape=(), dtype="string")
    hub_x = hub_preprocessor(hub_inputs)
    hub_embedding = keras.layers.GlobalAveragePooling1D()(hub_backbone(hub_x),
                                                         hub_x["padding_mask"])
    hub_encoder = keras.Model(hub_inputs, keras.layers.UnitNormalization(axis=1)(hub_embedding))
    np.testing.assert_allclose(sentence_embeddings, to_numpy(hub_encoder(tf.constant(SENTENCES))),
                               atol=1e-5)

    # Our SentenceEncoder with mean pooling on the same backbone and preprocessor: the same.
    sentence_encoder = kb.tasks.SentenceEncoder(backbone, preprocessor, pooling_mode="mean")
    np.testing.assert_allclose(sentence_encoder.encode(SENTENCES), sentence_embeddings,
                               atol=1e-5)


def test_a_column_of_texts_is_a_batch_and_other_widths_are_named_errors(preset):
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset)
    column = np.array([[s] for s in SENTENCES])
    # The MLM preprocessor and a task on the classifier's read a column as its texts too.
    masker = kb.preprocessing.MaskedLMPreprocessor(preprocessor.tokenizer, sequence_length=16)
    np.testing.assert_array_equal(to_numpy(masker(column)[0]["padding_mask"]),
                                  to_numpy(masker(SENTENCES)[0]["padding_mask"]))
    classifier = kb.tasks.TextClassifier(kb.models.RobertaBackbone.from_preset(preset),
                                         preprocessor=preprocessor, num_classes=2)
    np.testing.assert_allclose(classifier.predict(column, verbose=0),
                               classifier.predict(SENTENCES, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match=r"TextClassifierPreprocessor takes a batch of texts.*"
                                         r"of rank 2 \(shape \(None, 2\)\)"):
        preprocessor(keras.Input(shape=(2,), dtype="string"))
    with pytest.raises(ValueError, match=r"of rank 3 \(shape \(2, 1, 1\)\)"):
        preprocessor(np.array([[["a"]], [["b"]]]))
    # A (batch, None) tensor (a dataset's batch of [1] columns) is a column if it is one.
    unknown_width = tf.function(preprocessor, input_signature=[
        tf.TensorSpec([None, None], tf.string)])
    assert unknown_width(tf.constant([["a"], ["b"]]))["token_ids"].shape[0] == 2
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"read as a \(batch, 1\) column of texts; got 2 texts in a row"):
        unknown_width(tf.constant([["a", "b"]]))


# === "Fine-tune using the regression objective function" ===


def test_regression_siamese_fits_on_scored_pairs(preset, rotten_tomatoes, mixed_float16):
    TRAIN_BATCH_SIZE = 6
    VALIDATION_BATCH_SIZE = 8

    TRAIN_NUM_BATCHES = 2
    VALIDATION_NUM_BATCHES = 1  # built as in the example, its check left out (see the fit)

    def change_range(x):
        return (x / 2.5) - 1

    def prepare_dataset(dataset, num_batches, batch_size):
        dataset = dataset.map(
            lambda z: (
                [z["sentence1"], z["sentence2"]],
                [tf.cast(change_range(z["label"]), tf.float32)],
            ),
            num_parallel_calls=AUTOTUNE,
        )
        dataset = dataset.batch(batch_size)
        dataset = dataset.take(num_batches)
        dataset = dataset.prefetch(AUTOTUNE)
        return dataset

    stsb_train = _stsb(rotten_tomatoes, 0, TRAIN_BATCH_SIZE * TRAIN_NUM_BATCHES)
    stsb_valid = _stsb(rotten_tomatoes, 100, VALIDATION_BATCH_SIZE * VALIDATION_NUM_BATCHES)
    stsb_train = prepare_dataset(stsb_train, TRAIN_NUM_BATCHES, TRAIN_BATCH_SIZE)
    stsb_valid = prepare_dataset(stsb_valid, VALIDATION_NUM_BATCHES, VALIDATION_BATCH_SIZE)

    for x, y in stsb_train:
        assert x.shape == (6, 2) and x.dtype == tf.string and y.shape == (6, 1)
        # scores 4 and 1, rescaled to the cosine's range: 0.6 and -0.6, both here
        np.testing.assert_allclose(sorted(set(to_numpy(y).ravel().tolist())), [-0.6, 0.6])
        break

    roberta_normal_encoder, _, backbone = _normal_encoder(preset)
    assert backbone.dtype_policy.name == "mixed_float16"

    query = ["The dog is enjoying his meal."]
    encoder = roberta_normal_encoder
    sentence_embeddings = encoder(tf.constant(SENTENCES))
    query_embedding = encoder(tf.constant(query))
    cosine_similarity_scores = tf.matmul(query_embedding, tf.transpose(sentence_embeddings))
    before = to_numpy(cosine_similarity_scores)
    assert before.shape == (1, 3) and np.all(np.abs(before) <= 1.01)

    roberta_regression_siamese = RegressionSiamese(roberta_normal_encoder)
    roberta_regression_siamese.compile(
        loss=keras.losses.MeanSquaredError(),
        optimizer=keras.optimizers.Adam(2e-5),
        jit_compile=False,
    )
    initial = _weights(backbone)
    # The example passes validation_data=stsb_valid: a pass that ran here (as the triplet
    # fit's), but traces the whole siamese step again (10-15 s on this host) to check Keras'
    # evaluate, nothing of ours; the validation batch is read instead.
    history = roberta_regression_siamese.fit(stsb_train, epochs=1, verbose=0).history
    assert set(history) == {"loss"} and np.isfinite(history["loss"][0])
    x, y = next(iter(stsb_valid))
    assert x.shape == (8, 2) and y.shape == (8, 1)

    query = ["The dog is enjoying his food."]
    encoder = roberta_regression_siamese.get_encoder()
    assert encoder is roberta_normal_encoder
    sentence_embeddings = encoder(tf.constant(SENTENCES))
    query_embedding = encoder(tf.constant(query))
    cosine_simalarities = to_numpy(
        tf.matmul(query_embedding, tf.transpose(sentence_embeddings)))
    assert cosine_simalarities.shape == (1, 3) and np.isfinite(cosine_simalarities).all()
    # The siamese fit trained the shared encoder's backbone.
    assert any(np.abs(a - b).max() > 0 for a, b in zip(initial, _weights(backbone)))


# === "Fine-tune using the triplet objective function", then the clustering ===


def test_triplet_siamese_fits_on_triplets_and_clusters(preset, rotten_tomatoes, tmp_path):
    # float32 and no validation pass here (the example: mixed_float16 and validation_data=
    # wiki_test): the regression fit above runs mixed_float16; both ran here once, and each
    # costs another trace of the whole siamese step (10-15 s on this host).
    NUM_TRAIN_BATCHES = 2

    def prepare_wiki_data(dataset, num_batches):
        dataset = dataset.map(
            lambda z: ((z["Sentence1"], z["Sentence2"], z["Sentence3"]), 0)
        )
        dataset = dataset.batch(6)
        dataset = dataset.take(num_batches)
        dataset = dataset.prefetch(AUTOTUNE)
        return dataset

    wiki_train = tf.data.experimental.make_csv_dataset(
        _wiki_csv(tmp_path / "train.csv", rotten_tomatoes, 0, 6 * NUM_TRAIN_BATCHES),
        batch_size=1,
        num_epochs=1,
    )
    wiki_train = prepare_wiki_data(wiki_train, NUM_TRAIN_BATCHES)

    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset)
    backbone = kb.models.RobertaBackbone.from_preset(preset)
    input = keras.Input(shape=(1,), dtype="string", name="sentence")

    x = preprocessor(input)
    h = backbone(x)["sequence_output"]  # Difference: a dict (keras-hub: the sequence tensor)
    embedding = keras.layers.GlobalAveragePooling1D(name="pooling_layer")(
        h, x["padding_mask"]
    )

    roberta_encoder = keras.Model(inputs=input, outputs=embedding)

    roberta_triplet_siamese = TripletSiamese(roberta_encoder)
    assert roberta_triplet_siamese.output.shape == (2, None)
    roberta_triplet_siamese.compile(
        loss=TripletLoss(),
        optimizer=keras.optimizers.Adam(2e-5),
        jit_compile=False,
    )
    initial = _weights(backbone)
    history = roberta_triplet_siamese.fit(wiki_train, epochs=1, verbose=0).history
    # The loss is a hinge with margin 1 over distances between embeddings.
    assert set(history) == {"loss"}
    assert np.isfinite(history["loss"][0]) and history["loss"][0] >= 0
    assert any(np.abs(a - b).max() > 0 for a, b in zip(initial, _weights(backbone)))

    encoder = roberta_triplet_siamese.get_encoder()
    embeddings = encoder(tf.constant(QUESTIONS))
    assert tuple(embeddings.shape) == (6, 16)
    unblock_imports()  # scikit-learn, which the example clusters with
    import sklearn.cluster as cluster

    kmeans = cluster.KMeans(n_clusters=2, random_state=0, n_init="auto").fit(embeddings)
    assert sorted(set(kmeans.labels_.tolist())) == [0, 1] and len(kmeans.labels_) == 6
