"""keras.io "Data Parallel Training with KerasHub and tf.distribute" (examples/nlp/
data_parallel_training_with_keras_hub.py; its KerasNLP twin data_parallel_training_with_keras_nlp.py
has the same code), ported as a conformance test: every call of the example as written, with only
names changed (keras_hub.models.BertMaskedLM -> kb.tasks.MaskedLM), data (a few hundred real
Rotten Tomatoes lines with wikitext-like " = Heading = " and empty lines in
wiki.{train,valid,test}.tokens files for wikitext-2, read with TextLineDataset as the example
does), sizes (base batch size 4, 2 epochs for 3), load_weights=False (the preset's weights are not
offline) and devices: the example splits one GPU into two logical GPUs; here the one CPU is split
into two logical CPUs (as test_distribute does), before anything initializes TensorFlow's devices,
so the whole port runs in one subprocess.

The older "Distributed Training with KerasNLP" (distributed_training_with_keras_nlp.py) is a Keras 2
program (`from tensorflow import keras`, `optimizer.lr`, a bare `weighted_metrics=` metric, which
Keras 3 itself refuses for any model) and is not ported.
"""

import keras_hub
import numpy as np
import pytest

import keras_bertfam as kb
from tests.conftest import TF_TEST_SETTINGS
from tests.test_distribute import _result, _stdout, tensorflow_processes

EXAMPLE = r'''
import os, sys, json
import numpy as np
os.environ["KERAS_BACKEND"] = "tensorflow"
import tensorflow as tf
''' + TF_TEST_SETTINGS + r'''
import keras
import keras_bertfam as kb
wiki_dir = sys.argv[1] + "/"
os.chdir(sys.argv[2])  # TensorBoard's "./logs"
result = {}
keras.utils.set_random_seed(0)  # not the example's: the same initial weights in every run

# The example: physical_devices = tf.config.list_physical_devices("GPU") split into two logical
# GPUs of half the memory each. Here the CPU (a CPU's logical devices take no memory limit).
physical_devices = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    physical_devices[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)
logical_devices = tf.config.list_logical_devices("CPU")
result["logical_devices"] = [d.name for d in logical_devices]

EPOCHS = 2  # the example: 3

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
result["replicas"] = strategy.num_replicas_in_sync

base_batch_size = 4  # the example: 32
base_learning_rate = 1e-4

scaled_batch_size = base_batch_size * strategy.num_replicas_in_sync
scaled_learning_rate = base_learning_rate * strategy.num_replicas_in_sync

wiki_train_ds = (
    tf.data.TextLineDataset(
        wiki_dir + "wiki.train.tokens",
    )
    .filter(lambda x: tf.strings.length(x) > 100)
    .shuffle(buffer_size=500)
    .batch(scaled_batch_size)
    .cache()
    .prefetch(tf.data.AUTOTUNE)
)
wiki_val_ds = (
    tf.data.TextLineDataset(wiki_dir + "wiki.valid.tokens")
    .filter(lambda x: tf.strings.length(x) > 100)
    .shuffle(buffer_size=500)
    .batch(scaled_batch_size)
    .cache()
    .prefetch(tf.data.AUTOTUNE)
)
wiki_test_ds = (
    tf.data.TextLineDataset(wiki_dir + "wiki.test.tokens")
    .filter(lambda x: tf.strings.length(x) > 100)
    .shuffle(buffer_size=500)
    .batch(scaled_batch_size)
    .cache()
    .prefetch(tf.data.AUTOTUNE)
)

total_training_steps = sum(1 for _ in wiki_train_ds.as_numpy_iterator()) * EPOCHS
lr_schedule = tf.keras.optimizers.schedules.PolynomialDecay(
    initial_learning_rate=scaled_learning_rate,
    decay_steps=total_training_steps,
    end_learning_rate=0.0,
)
result["total_training_steps"] = total_training_steps
result["schedule"] = [float(lr_schedule(0)), float(lr_schedule(total_training_steps))]


class PrintLR(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(
            f"\nLearning rate for epoch {epoch + 1} is {model_dist.optimizer.learning_rate.numpy()}"
        )


callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir="./logs"),
    PrintLR(),
]

print(tf.config.list_physical_devices("GPU"))

with strategy.scope():
    model_dist = kb.tasks.MaskedLM.from_preset("bert_tiny_en_uncased", load_weights=False)

    model_dist.get_layer("bert_backbone").get_layer("pooled_dense").trainable = False

    model_dist.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.AdamW(learning_rate=scaled_learning_rate),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
        jit_compile=False,
    )
    initial = model_dist.get_weights()

    history = model_dist.fit(
        wiki_train_ds, validation_data=wiki_val_ds, epochs=EPOCHS, callbacks=callbacks
    )

result["history"] = history.history
result["evaluate"] = model_dist.evaluate(wiki_test_ds)

# What a user checks: the variables are mirrored on both devices, the unused pooler frozen ...
kernel = model_dist.backbone.token_embedding.embeddings.value
result["mirrored"] = type(kernel).__name__
result["kernel_devices"] = sorted(v.device for v in kernel.values)
pooler = {id(v) for v in model_dist.backbone.pooled_dense.weights}
result["pooler_trainable"] = any(id(v) in pooler for v in model_dist.trainable_weights)
trained = model_dist.get_weights()
moved = [float(np.abs(a - b).max()) for a, b in zip(initial, trained)]
result["pooler_moved"] = max(m for m, v in zip(moved, model_dist.weights) if id(v) in pooler)
result["moved"] = max(moved)
# ... and, on the same masked test batches (masks drawn once: the example's evaluate draws new
# ones each time), two replicas evaluate the trained weights as one device does, and to a lower
# loss than the initial weights.
fixed = wiki_test_ds.map(model_dist.preprocessor).cache()
result["fixed_batches"] = sum(1 for _ in fixed)


def masked_lm(trained_weights):
    model = kb.tasks.MaskedLM.from_preset("bert_tiny_en_uncased", load_weights=False,
                                          preprocessor=None)
    model.set_weights(trained_weights)
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
        jit_compile=False,
    )
    return model


# Two replicas: the trained model itself, its preprocessor detached (`fixed` is preprocessed),
# with the evaluate step the example's evaluate traced (a second model under the strategy traced
# its own: ~5 s of CPU of this file's ~52).
model_dist.preprocessor = None
result["evaluate_fixed"] = model_dist.evaluate(fixed, verbose=0)
model_single = masked_lm(trained)
result["evaluate_fixed_single"] = model_single.evaluate(fixed, verbose=0)
model_single.set_weights(initial)
result["evaluate_fixed_initial"] = model_single.evaluate(fixed, verbose=0)
result["tensorboard"] = sorted(os.listdir("logs"))
print(json.dumps(result))
'''


# The splits' lines that pass the example's filter (`tf.strings.length(x) > 100`), each split also
# holding short lines, " = Heading = " lines and empty lines that it drops: 2 global batches of 8
# to train on, 1 to validate and 2 to test, the last one partial (13 lines: 8 + 5, split 3 / 2
# between the replicas). Each batch costs a step on both devices (the fit's CPU time is mostly
# the mirrored step's tracing and Keras' symbolic build under the strategy).
LONG_LINES = {"train": 16, "valid": 8, "test": 13}


def write_wikitext(wiki_dir):
    """wiki.{train,valid,test}.tokens in `wiki_dir` (made), as above. -> `wiki_dir`"""
    wiki_dir.mkdir()
    sentences = [" " + t.decode() for t, _ in
                 kb.preprocessing.corpus.movie_reviews_sentences().take(1000).as_numpy_iterator()]
    long = iter([t for t in sentences if len(t.encode()) > 100])
    short = iter([t for t in sentences if len(t.encode()) <= 100])
    for split, count in LONG_LINES.items():
        lines = []
        for i in range(count):
            if i % 6 == 0:
                lines += ["", f" = Section {i // 6} = ", ""]
            lines += [next(long)] + [next(short) for _ in range(6)]
        (wiki_dir / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    return wiki_dir


@pytest.fixture(scope="module")
def data_parallel_run(bert_vocab, tmp_path_factory):
    """The example's process, forked with test_distribute's TensorFlow processes (importing the
    libraries once for all of them) and run once per test run with them."""
    out = _stdout(tensorflow_processes(bert_vocab, tmp_path_factory)["example"])
    return _result(out), out


def test_data_parallel_fit_replicates_over_two_devices(data_parallel_run):
    result, _ = data_parallel_run
    # MirroredStrategy() takes the two logical devices, as the example's two logical GPUs.
    assert result["logical_devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert result["replicas"] == 2
    assert result["mirrored"] == "MirroredVariable"
    assert [d.split("/")[-1] for d in result["kernel_devices"]] == ["device:CPU:0",
                                                                   "device:CPU:1"]
    assert result["total_training_steps"] == 2 * 2  # 2 batches of 8 filtered lines, 2 epochs


def test_data_parallel_fit_trains_and_validates(data_parallel_run):
    result, _ = data_parallel_run
    history = result["history"]
    assert set(history) == {"loss", "sparse_categorical_accuracy", "val_loss",
                            "val_sparse_categorical_accuracy"}
    assert all(len(v) == 2 and np.isfinite(v).all() for v in history.values())
    assert result["moved"] > 1e-4
    # The example's frozen pooler: not trained, not moved (weight decay included).
    assert not result["pooler_trainable"] and result["pooler_moved"] == 0.0
    # On the same masked test batches the trained weights predict better than the initial ones.
    assert result["evaluate_fixed"][0] < result["evaluate_fixed_initial"][0]


def test_data_parallel_evaluate_equals_one_device(data_parallel_run):
    result, _ = data_parallel_run
    loss, accuracy = result["evaluate"]
    assert np.isfinite(loss) and 0 <= accuracy <= 1
    assert result["fixed_batches"] == 2
    np.testing.assert_allclose(result["evaluate_fixed"], result["evaluate_fixed_single"],
                               rtol=1e-5, atol=1e-6)


def test_data_parallel_callbacks(data_parallel_run):
    result, out = data_parallel_run
    # The learning-rate schedule the example builds (and does not pass to the optimizer).
    assert result["schedule"] == pytest.approx([2e-4, 0.0])
    # PrintLR fired at each epoch's end with the optimizer's (scaled) learning rate.
    printed = [line for line in out.splitlines() if line.startswith("Learning rate for epoch")]
    assert [line.split()[4] for line in printed] == ["1", "2"]
    assert [float(line.split()[-1]) for line in printed] == pytest.approx([2e-4, 2e-4])
    # TensorBoard wrote both logs (`tensorboard`, not a TensorFlow dependency: the dev extras).
    assert {"train", "validation"} <= set(result["tensorboard"])


# The example's `get_layer("bert_backbone").get_layer("pooled_dense")`: keras-hub's layer names.
# Our backbone nests them (`embeddings`, `encoder`, `pooler`); `get_layer` finds keras-hub's
# names too, as the same-named attributes (`pooled_dense`, `token_embedding`, ...).
@pytest.mark.multibackend
def test_get_layer_takes_keras_hubs_backbone_layer_names():
    config = dict(vocabulary_size=300, num_layers=2, num_heads=2, hidden_dim=16,
                  intermediate_dim=32, max_sequence_length=16)
    ours = kb.tasks.MaskedLM(kb.models.BertBackbone(**config), preprocessor=None)
    hub = keras_hub.models.BertBackbone(**config)
    backbone = ours.get_layer("bert_backbone")
    assert backbone is ours.backbone  # keras-hub names its BertBackbone so too
    for name in ["pooled_dense", "token_embedding", "position_embedding", "segment_embedding",
                 "embeddings_layer_norm", "embeddings_dropout", "transformer_layer_1"]:
        layer, hub_layer = backbone.get_layer(name), hub.get_layer(name)
        assert sorted(tuple(w.shape) for w in layer.weights) == sorted(
            tuple(w.shape) for w in hub_layer.weights), name
    assert backbone.get_layer("pooled_dense") is backbone.pooler_dense
    assert backbone.get_layer("transformer_layer_1") is backbone.transformer_layers[1]
    assert backbone.get_layer("pooler") is backbone.pooler_dense  # our own name still
    # The example's line: the pooler frozen (a MaskedLM does not train it anyway).
    backbone.get_layer("pooled_dense").trainable = False
    assert not backbone.pooler_dense.trainable
    # A name neither has, and a keras-hub name this backbone has no layer for, still fail.
    with pytest.raises(ValueError, match="No such layer: pooled_dence"):
        backbone.get_layer("pooled_dence")
    with pytest.raises(ValueError, match="No such layer: transformer_layer_2"):
        backbone.get_layer("transformer_layer_2")
    electra = kb.models.ElectraBackbone(**config)  # no pooler (HF's ELECTRA has none)
    with pytest.raises(ValueError, match="No such layer: pooled_dense"):
        electra.get_layer("pooled_dense")
