"""keras.io "MultipleChoice Task with Transfer Learning" (examples/nlp/
multiple_choice_task_with_transfer_learning.py), ported as a conformance test.

The example fine-tunes keras-hub's DebertaV3 on SWAG; DeBERTa has no counterpart here, so the same
code runs on a BERT: `DebertaV3Preprocessor` -> `kb.preprocessing.TextClassifierPreprocessor`,
`DebertaV3Classifier` -> `kb.tasks.TextClassifier` (README's mapping table), both `from_preset` of
a tiny BERT preset directory made here (a WordPiece vocabulary learned from the rows, one layer,
hidden 16). SWAG is not offline: a few rows with SWAG's columns (sent1, sent2, startphrase,
ending0-3, label) are cut from real Rotten Tomatoes sentences (`kb.preprocessing.corpus`), the
right ending a sentence's own end, the wrong ones other sentences' ends. The tests run without
pandas (conftest blocks it): the DataFrames are lists of rows that read as pandas rows do
(`row.ending0`, `row["options"] = ...`), `df.options.tolist()` a list comprehension. Sizes are
tiny: sequence length 32 (the example's 200), batch size 4 (8), 1 epoch (5).

Sections of the example and what happened to them:
- Setup, Configuration, Reproducibility: ported (CFG with the sizes above).
- Dataset, Meta Data: SWAG replaced by the rows built here (same columns), no `sample(frac=)`.
- Contextualize Options (`make_options`), Preprocessing (`preprocessor(options)`,
  `preprocess_fn`), Augmentation (`option_shuffle`, `augment_fn`), DataLoader
  (`build_dataset`), LR Schedule (`get_lr_callback`), Callbacks (`get_callbacks`: the
  scheduler and a `ModelCheckpoint` of "best.keras" on val_accuracy), MultipleChoice Model
  (`SelectOption`, `build_model`, compile), Training (`fit` with `steps_per_epoch` and
  validation), Inference (`predict`, argsort, the printed predictions): ported as written.
- `build_model`'s inputs: "segment_ids" added, BERT's third input (see there: without it
  Keras 3.15.1 feeds the preprocessor's segment ids to the model as its token ids).
- `get_lr_callback(..., plot=True)` and `keras.utils.plot_model`: not ported (matplotlib
  figures and a pydot/graphviz image; nothing to check offline).

Then the example's data goes to this library's own `kb.tasks.MultipleChoice`, whose head is HF's
`*ForMultipleChoice` (dropout -> Dense(1) on the pooled output), the layout the example builds by
hand with `num_classes=1`: on the same weights and features it scores as the example's model.
Fed the example's dataset (one-hot labels) it failed inside the train step with a shape error;
it now names the labels' shape and the `tf.argmax` map (TextClassifier likewise).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf  # For tf.data only.

import keras_bertfam as kb
from conftest import tiny_bert_of, to_numpy

NUM_TRAIN_ROWS, NUM_VALID_ROWS = 8, 4


class CFG:
    preset = None  # the tiny preset directory (`swag_preset`)
    sequence_length = 32  # Input sequence length (the example's 200)
    seed = 42  # Random seed
    epochs = 1  # Training epochs (the example's 5)
    batch_size = 4  # Batch size (the example's 8)
    augment = True  # Augmentation (Shuffle Options)


# The example compiles with jit_compile=True. Not here: XLA's compilation of the four unrolled
# classifier calls (train, validation and predict steps) took 35 s of this file's 65 s on TF on
# this host, and what is checked is the library's behaviour, not XLA's.
EXAMPLE_JIT = False


class Row(dict):
    """A pandas row as `make_options` reads and writes it: `row.startphrase`, `row["options"]`."""

    __getattr__ = dict.__getitem__


def _swag_rows():
    """SWAG-like rows from real Rotten Tomatoes sentences: a sentence's first half is `sent1`,
    its next word `sent2` (SWAG's start of the second sentence), its rest the right ending; the
    wrong endings are the next three rows' right ones; the right one at position `i % 4`."""
    sentences = []
    for text, _ in kb.preprocessing.corpus.movie_reviews_sentences().as_numpy_iterator():
        words = text.decode().split()
        if 8 <= len(words) <= 14:
            sentences.append(words)
        if len(sentences) == NUM_TRAIN_ROWS + NUM_VALID_ROWS:
            break
    cut = [len(w) // 2 for w in sentences]
    rights = [" ".join(w[c + 1:]) for w, c in zip(sentences, cut)]
    rows = []
    for i, (words, c) in enumerate(zip(sentences, cut)):
        label = i % 4
        wrong = [rights[(i + k) % len(rights)] for k in (1, 2, 3)]
        endings = wrong[:label] + [rights[i]] + wrong[label:]
        sent1, sent2 = " ".join(words[:c]), words[c]
        rows.append(Row(sent1=sent1, sent2=sent2, startphrase=f"{sent1} {sent2}", label=label,
                        **{f"ending{k}": e for k, e in enumerate(endings)}))
    return rows[:NUM_TRAIN_ROWS], rows[NUM_TRAIN_ROWS:]


@pytest.fixture(scope="module")
def swag_preset(tmp_path_factory):
    """The tiny BERT preset the example's `from_preset(CFG.preset, ...)` calls load."""
    train_df, valid_df = _swag_rows()
    texts = [r.startphrase for r in train_df + valid_df] + \
        [r[f"ending{k}"] for r in train_df + valid_df for k in range(4)]
    tokenizer, backbone = tiny_bert_of(texts)
    preset = str(tmp_path_factory.mktemp("swag") / "tiny_bert")
    kb.tasks.TextClassifier(backbone, num_classes=1, preprocessor=kb.preprocessing.
                            TextClassifierPreprocessor(tokenizer, 32)).save_to_preset(preset)
    return preset, train_df, valid_df


# Selects one option from five
class SelectOption(keras.layers.Layer):
    def __init__(self, index, **kwargs):
        super().__init__(**kwargs)
        self.index = index

    def call(self, inputs):
        # Selects a specific slice from the inputs tensor
        return inputs[:, self.index, :]

    def get_config(self):
        # For serialize the model
        base_config = super().get_config()
        config = {
            "index": self.index,
        }
        return {**base_config, **config}


@pytest.fixture(scope="module")
def example(swag_preset, tmp_path_factory):
    """The example from its configuration to its predictions, with its own names."""
    CFG.preset, train_df, valid_df = swag_preset
    keras.utils.set_random_seed(CFG.seed)
    workdir = tmp_path_factory.mktemp("example")

    # Define a function to create options based on the prompt and choices
    def make_options(row):
        row["options"] = [
            f"{row.startphrase}\n{row.ending0}",  # Option 0
            f"{row.startphrase}\n{row.ending1}",  # Option 1
            f"{row.startphrase}\n{row.ending2}",  # Option 2
            f"{row.startphrase}\n{row.ending3}",
        ]  # Option 3
        return row

    train_df = [make_options(row) for row in train_df]  # train_df.apply(make_options, axis=1)
    valid_df = [make_options(row) for row in valid_df]

    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        preset=CFG.preset,  # Name of the model
        sequence_length=CFG.sequence_length,  # Max sequence length, will be padded if shorter
    )
    outs = preprocessor(train_df[0].options)  # Process options for the first row

    def preprocess_fn(text, label=None):
        text = preprocessor(text)  # Preprocess text
        return (
            (text, label) if label is not None else text
        )  # Return processed text and label if available

    def option_shuffle(options, labels, prob=0.50, seed=None):
        if tf.random.uniform([]) > prob:  # Shuffle probability check
            return options, labels
        # Shuffle indices of options and labels in the same order
        indices = tf.random.shuffle(tf.range(tf.shape(options)[0]), seed=seed)
        # Shuffle options and labels
        options = tf.gather(options, indices)
        labels = tf.gather(labels, indices)
        return options, labels

    def augment_fn(text, label=None):
        text, label = option_shuffle(text, label, prob=0.5)  # Shuffle the options
        return (text, label) if label is not None else text

    def build_dataset(
        texts,
        labels=None,
        batch_size=32,
        cache=False,
        augment=False,
        repeat=False,
        shuffle=1024,
    ):
        AUTO = tf.data.AUTOTUNE  # AUTOTUNE option
        slices = (
            (texts,)
            if labels is None
            else (texts, keras.utils.to_categorical(labels, num_classes=4))
        )  # Create slices
        ds = tf.data.Dataset.from_tensor_slices(slices)  # Create dataset from slices
        ds = ds.cache() if cache else ds  # Cache dataset if enabled
        if augment:  # Apply augmentation if enabled
            ds = ds.map(augment_fn, num_parallel_calls=AUTO)
        ds = ds.map(preprocess_fn, num_parallel_calls=AUTO)  # Map preprocessing function
        ds = ds.repeat() if repeat else ds  # Repeat dataset if enabled
        opt = tf.data.Options()  # Create dataset options
        if shuffle:
            ds = ds.shuffle(shuffle, seed=CFG.seed)  # Shuffle dataset if enabled
            opt.experimental_deterministic = False
        ds = ds.with_options(opt)  # Set dataset options
        ds = ds.batch(batch_size, drop_remainder=True)  # Batch dataset
        ds = ds.prefetch(AUTO)  # Prefetch next batch
        return ds  # Return the built dataset

    # Build train dataloader
    train_texts = [row.options for row in train_df]  # train_df.options.tolist()
    train_labels = [row.label for row in train_df]  # train_df.label.tolist()
    train_ds = build_dataset(
        train_texts,
        train_labels,
        batch_size=CFG.batch_size,
        cache=True,
        shuffle=True,
        repeat=True,
        augment=CFG.augment,
    )

    # Build valid dataloader
    valid_texts = [row.options for row in valid_df]
    valid_labels = [row.label for row in valid_df]
    valid_ds = build_dataset(
        valid_texts,
        valid_labels,
        batch_size=CFG.batch_size,
        cache=True,
        shuffle=False,
        repeat=False,
        augment=False,
    )

    import math

    def get_lr_callback(batch_size=8, mode="cos", epochs=10):  # (its plot=True: not ported)
        lr_start, lr_max, lr_min = 1.0e-6, 0.6e-6 * batch_size, 1e-6
        lr_ramp_ep, lr_sus_ep = 2, 0

        def lrfn(epoch):  # Learning rate update function
            if epoch < lr_ramp_ep:
                lr = (lr_max - lr_start) / lr_ramp_ep * epoch + lr_start
            elif epoch < lr_ramp_ep + lr_sus_ep:
                lr = lr_max
            else:
                decay_total_epochs, decay_epoch_index = (
                    epochs - lr_ramp_ep - lr_sus_ep + 3,
                    epoch - lr_ramp_ep - lr_sus_ep,
                )
                phase = math.pi * decay_epoch_index / decay_total_epochs
                lr = (lr_max - lr_min) * 0.5 * (1 + math.cos(phase)) + lr_min
            return lr

        return keras.callbacks.LearningRateScheduler(
            lrfn, verbose=False
        )  # Create lr callback

    def get_callbacks():
        callbacks = []
        lr_cb = get_lr_callback(CFG.batch_size)  # Get lr callback
        ckpt_cb = keras.callbacks.ModelCheckpoint(
            str(workdir / "best.keras"),  # the example's f"best.keras", in a temporary directory
            monitor="val_accuracy",
            save_best_only=True,
            save_weights_only=False,
            mode="max",
        )  # Get Model checkpoint callback
        callbacks.extend([lr_cb, ckpt_cb])  # Add lr and checkpoint callbacks
        return callbacks  # Return the list of callbacks

    callbacks = get_callbacks()

    def build_model():
        # Define input layers
        inputs = {
            "token_ids": keras.Input(shape=(4, None), dtype="int32", name="token_ids"),
            # BERT's third input (DeBERTa has none; keras-hub's BertPreprocessor gives it too).
            # Left out, the example's model still runs, wrongly: Keras 3.15.1 warns that the
            # dataset's dict does not match its inputs and then pairs them by sorted position
            # (keras-team/keras#23258), "segment_ids" going in as the token ids.
            "segment_ids": keras.Input(shape=(4, None), dtype="int32", name="segment_ids"),
            "padding_mask": keras.Input(
                shape=(4, None), dtype="int32", name="padding_mask"
            ),
        }
        # Create a TextClassifier model
        classifier = kb.tasks.TextClassifier.from_preset(
            CFG.preset,
            preprocessor=None,
            num_classes=1,  # one output per one option, for five options total 5 outputs
        )
        logits = []
        # Loop through each option (Q+A), (Q+B) etc and compute associted logits
        for option_idx in range(4):
            option = {
                k: SelectOption(option_idx, name=f"{k}_{option_idx}")(v)
                for k, v in inputs.items()
            }
            logit = classifier(option)
            logits.append(logit)

        # Compute final output
        logits = keras.layers.Concatenate(axis=-1)(logits)
        outputs = keras.layers.Softmax(axis=-1)(logits)
        model = keras.Model(inputs, outputs)

        # Compile the model with optimizer, loss, and metrics
        model.compile(
            optimizer=keras.optimizers.AdamW(5e-6),
            loss=keras.losses.CategoricalCrossentropy(label_smoothing=0.02),
            metrics=[
                keras.metrics.CategoricalAccuracy(name="accuracy"),
            ],
            jit_compile=EXAMPLE_JIT,
        )
        return model

    model = build_model()
    model.summary(print_fn=lambda *args, **kwargs: None)

    history = model.fit(
        train_ds,
        epochs=CFG.epochs,
        validation_data=valid_ds,
        callbacks=callbacks,
        steps_per_epoch=int(len(train_df) / CFG.batch_size),
        verbose=0,
    )

    # Make predictions using the trained model on last validation data
    predictions = model.predict(
        valid_ds,
        batch_size=CFG.batch_size,  # max batch size = valid size
        verbose=0,
    )

    # Format predictions and true answers
    pred_answers = np.arange(4)[np.argsort(-predictions)][:, 0]
    true_answers = np.array([row.label for row in valid_df])  # valid_df.label.values

    # Check the predictions (the example prints rows 0, 10, ..., 40 of its ~400)
    printed = []
    for i in range(0, len(valid_df)):
        row = valid_df[i]  # valid_df.iloc[i]
        pred_answer = f"ending{pred_answers[i]}"
        true_answer = f"ending{true_answers[i]}"
        printed.append((row.startphrase, row[true_answer], row[pred_answer]))

    return dict(locals())


def test_options_and_preprocessing(example):
    outs, valid_df = example["outs"], example["valid_df"]
    # The preprocessor packs each option alone: (num_choices, sequence_length).
    assert {k: tuple(v.shape) for k, v in outs.items()} == {
        "token_ids": (4, CFG.sequence_length), "segment_ids": (4, CFG.sequence_length),
        "padding_mask": (4, CFG.sequence_length)}
    assert valid_df[0].options[0] == f"{valid_df[0].startphrase}\n{valid_df[0].ending0}"
    # keras-hub's BERT preprocessor on the same vocabulary packs the options alike (its
    # padding_mask bool: README, Differences from keras-hub).
    import keras_hub

    preprocessor = example["preprocessor"]
    hub = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=preprocessor.tokenizer.get_vocabulary(),
                                       lowercase=True), sequence_length=CFG.sequence_length)
    hub_outs = hub(example["train_df"][0].options)
    for k, v in outs.items():
        np.testing.assert_array_equal(to_numpy(v), to_numpy(hub_outs[k]).astype(v.dtype.name))
    x, y = next(iter(example["train_ds"]))
    assert x["token_ids"].shape == (CFG.batch_size, 4, CFG.sequence_length)
    assert y.shape == (CFG.batch_size, 4) and y.dtype.is_floating  # one-hot


def test_option_shuffle_moves_the_label_with_its_option(example):
    options = tf.constant(example["valid_df"][1].options)
    label = tf.constant(keras.utils.to_categorical(1, num_classes=4))
    tf.random.set_seed(0)
    seen = set()
    for _ in range(8):
        shuffled, shuffled_label = example["option_shuffle"](options, label, prob=1.0)
        right = int(np.argmax(shuffled_label))
        assert shuffled.numpy()[right] == options.numpy()[1]
        seen.add(tuple(shuffled.numpy()))
    assert len(seen) > 1


def test_training_checkpoint_and_inference(example):
    history = example["history"].history
    assert np.isfinite(history["loss"][0]) and np.isfinite(history["val_loss"][0])
    assert set(history) >= {"accuracy", "val_accuracy", "learning_rate"}
    # The scheduler's epoch-0 rate, set on the example's own AdamW.
    assert np.isclose(history["learning_rate"][0], 1e-6)
    predictions = example["predictions"]
    assert predictions.shape == (NUM_VALID_ROWS, 4)
    np.testing.assert_allclose(predictions.sum(-1), 1.0, rtol=1e-5)
    assert set(example["pred_answers"]) <= {0, 1, 2, 3}
    assert len(example["printed"]) == NUM_VALID_ROWS and all(all(p) for p in example["printed"])
    # "best.keras" (the whole model) reloads to the same predictions.
    best = keras.saving.load_model(str(example["workdir"] / "best.keras"),
                                   custom_objects={"SelectOption": SelectOption})
    # (its logits: the softmax of a 1-epoch tiny model is 0.25 within 1e-5 for any weights)
    x, _ = next(iter(example["valid_ds"]))
    np.testing.assert_allclose(_logits(best, x), _logits(example["model"], x), atol=1e-6)


def _logits(model, x):
    """The example's model's scores before its Softmax (its Concatenate's output)."""
    concatenate = next(layer for layer in model.layers
                       if isinstance(layer, keras.layers.Concatenate))
    return to_numpy(keras.Model(model.inputs, concatenate.output)(x, training=False))


# === From the example to kb.tasks.MultipleChoice ===
def _example_classifier(example):
    return next(layer for layer in example["model"].layers
                if isinstance(layer, kb.tasks.TextClassifier))


def _our_task(example):
    """kb.tasks.MultipleChoice on the example's trained backbone, its Dense(1) the example's
    classifier's: the head the example builds by hand (dropout -> Dense(1) on the pooled output,
    one logit per option, softmax over the options) is HF's `BertForMultipleChoice`'s, ours."""
    classifier = _example_classifier(example)
    task = kb.tasks.MultipleChoice(classifier.backbone, preprocessor=None)
    task.head.set_weights(classifier.head.get_weights())
    return task


def test_our_task_scores_the_example_s_features_as_the_example_s_model(example):
    x, _ = next(iter(example["valid_ds"]))
    classifier = _example_classifier(example)
    trained = classifier.head.get_weights()
    rng = np.random.default_rng(0)
    try:
        # A head of larger weights than one epoch at a 1e-6 rate leaves (its options' scores
        # tie within 1e-5): options apart, so that a mixed-up option order would show. (The
        # tiny backbone's pooled outputs of one row's options differ by ~1e-4; its trained
        # weights vary from run to run: the example's pipeline is not deterministic.)
        kernel, bias = trained
        classifier.head.set_weights([rng.normal(0, 1000, kernel.shape).astype("float32"),
                                     np.zeros_like(bias)])
        task = _our_task(example)
        theirs = _logits(example["model"], x)
        logits = to_numpy(task(x, training=False))  # (B, 4): the example's softmax inputs
        np.testing.assert_allclose(logits, theirs, rtol=1e-5, atol=1e-4)
        centered, theirs_centered = (v - v.mean(-1, keepdims=True) for v in (logits, theirs))
        assert np.ptp(theirs_centered, axis=-1).min() > 2e-2, theirs
        np.testing.assert_allclose(centered, theirs_centered, atol=2e-3)
        np.testing.assert_allclose(to_numpy(keras.ops.softmax(logits)),
                                   to_numpy(example["model"](x, training=False)), atol=1e-4)
    finally:
        classifier.head.set_weights(trained)


def test_our_task_takes_the_example_s_dataset_and_callbacks(example):
    """The example's datasets yield one-hot labels (`to_categorical`, its CategoricalCrossentropy);
    MultipleChoice takes the index of the right choice, as HF's and its label check says. Fed
    the example's dataset, its fit failed inside the train step with Keras' "Arguments `target`
    and `output` must have the same shape up until the last dimension: target.shape=(16,),
    output.shape=(4, None)" (on TF); now, before any step, the error in-memory one-hot labels
    get, naming the shape and the map that fixes it."""
    task = _our_task(example)
    with pytest.raises(ValueError, match=r"MultipleChoice takes one choice label per example "
                                         r"\(labels of shape \(N,\) or \(N, 1\)\); got labels of "
                                         r"shape \(4, 4\)\. .*tf\.argmax\(y, axis=-1\)"):
        task.fit(example["train_ds"], steps_per_epoch=1, verbose=0)
    # The fix the message gives, the example's optimizer (the task's default one follows a
    # warmup/decay schedule, which a LearningRateScheduler cannot set: Keras' TypeError) and
    # its scheduler. (Its checkpoint monitors val_accuracy: the task's metric is "accuracy".
    # No validation here: one more compiled step, checked by the example's own fit above.)
    train_ds = example["train_ds"].map(lambda x, y: (x, tf.argmax(y, axis=-1)))
    with pytest.raises(TypeError, match=r"created with a `LearningRateSchedule`"):
        task.fit(train_ds, callbacks=[example["get_lr_callback"](CFG.batch_size)],
                 steps_per_epoch=1, verbose=0)  # (at the epoch's start: nothing compiled)
    task.compile(optimizer=keras.optimizers.AdamW(5e-6))
    history = task.fit(train_ds, epochs=1, callbacks=[example["get_lr_callback"](CFG.batch_size)],
                       steps_per_epoch=1, verbose=0).history
    assert np.isfinite(history["loss"][0]) and np.isclose(history["learning_rate"][0], 1e-6)
    assert "accuracy" in history


def test_our_preprocessor_packs_the_example_s_options_as_pairs(example):
    """Raw text: our MultipleChoicePreprocessor packs `[CLS] startphrase [SEP] ending [SEP]`,
    the ending segment 1 (HF's SWAG packing); the example packs each option as one text,
    `[CLS] startphrase ending [SEP]` (its "\\n" is whitespace to WordPiece), segment 0. The
    ids are the same but for that [SEP]: the two models see different inputs, so their scores
    differ, by design of the example, not of either model (on the same features they are
    equal: the test above)."""
    valid_df = example["valid_df"]
    task = kb.tasks.MultipleChoice.from_preset(CFG.preset, sequence_length=CFG.sequence_length)
    x = ([row.startphrase for row in valid_df],
         [[row[f"ending{k}"] for k in range(4)] for row in valid_df])
    ours, _, _ = keras.utils.unpack_x_y_sample_weight(task.preprocessor(x))
    theirs = example["preprocessor"]([option for row in valid_df for option in row.options])
    sep = task.preprocessor.tokenizer.sep_token_id
    ours_ids = to_numpy(ours["token_ids"]).reshape(-1, CFG.sequence_length)
    for ids, segments, example_ids in zip(ours_ids, to_numpy(ours["segment_ids"]).reshape(
            ours_ids.shape), to_numpy(theirs["token_ids"])):
        first_sep = list(ids).index(sep)
        assert (segments[:first_sep + 1] == 0).all() and segments[first_sep + 1] == 1
        np.testing.assert_array_equal(np.delete(ids, first_sep), example_ids[:-1])


@pytest.mark.multibackend
def test_one_hot_labels_in_a_dataset_of_model_inputs_are_named_on_every_backend():
    """The check above without the example: a dataset of model inputs and one-hot labels is
    refused before any step, on every backend (JAX and torch gave their own shape errors from
    inside the step); a dataset's labels of shape (B,) or (B, 1) pass the check."""
    backbone = kb.models.BertBackbone(vocabulary_size=300, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    task = kb.tasks.MultipleChoice(backbone, preprocessor=None)
    rng = np.random.RandomState(0)
    features = {"token_ids": rng.randint(5, 300, (4, 3, 8)).astype("int32"),
                "segment_ids": np.zeros((4, 3, 8), "int32"),
                "padding_mask": np.ones((4, 3, 8), "int32")}
    one_hot = keras.utils.to_categorical([0, 2, 1, 0], num_classes=3)
    ds = tf.data.Dataset.from_tensor_slices((features, one_hot)).batch(2)
    with pytest.raises(ValueError, match=r"got labels of shape \(None, 3\)\. The label is the "
                                         r"index of the right choice"):
        task.fit(ds, verbose=0)
    for labels in (np.array([0, 2, 1, 0]), np.array([[0], [2], [1], [0]])):
        ds = tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)
        task._prepare(ds)  # the label check only: no step compiled
    # TextClassifier alike: one-hot rows were named in memory, failed inside the step in a
    # dataset ("Incompatible shapes: [2] vs. [6]" on TF).
    classifier = kb.tasks.TextClassifier(backbone, num_classes=3, preprocessor=None)
    rows = {k: v[:, 0] for k, v in features.items()}
    ds = tf.data.Dataset.from_tensor_slices((rows, one_hot)).batch(2)
    with pytest.raises(ValueError, match=r"got labels of shape \(None, 3\), one-hot or "
                                         r"probabilities \(num_classes=3\)\. Pass np\.argmax"
                                         r"\(y, axis=-1\) \(a dataset: ds\.map"):
        classifier.fit(ds, verbose=0)
    classifier._prepare(tf.data.Dataset.from_tensor_slices((rows, [0, 2, 1, 0])).batch(2))
    # Labels of a width the spec leaves unknown (a generator's) are left to the values' checks:
    # a regressor's (B, 1) targets declared (None, None) were refused as multi-target.
    regressor = kb.tasks.TextClassifier(backbone, num_classes=1, preprocessor=None)
    unknown = tf.data.Dataset.from_generator(
        lambda: iter([(rows, np.ones((4, 1), "float32"))]),
        output_signature=({k: tf.TensorSpec((None, None), tf.int32) for k in rows},
                          tf.TensorSpec((None, None), tf.float32)))
    regressor._prepare(unknown)
