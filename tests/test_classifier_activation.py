"""TextClassifier's `activation=` (keras-hub's output activation, e.g. "softmax" for
probabilities): applied after the same logits, kept through configs, `.keras` files, weights
files and presets, and read back as logits by what needs logits (the default loss, the analysis
tools, HF export; the SavedModel's outputs are in test_export.py).

Tiny random BERTs (vocabulary 28, hidden 16, one layer); no tf.data but the presets'.
"""
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import to_numpy
from keras_bertfam.preprocessing import finetuning as ft

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a film was great dull bad good movie story actor plot who wrote it ada , . ! ? "
    "##s ##ing ##ed"
).split()
TEXTS = ["the film was great!", "a dull plot, bad actor", "ada wrote it", "good story ."]
LABELS = np.array([1, 0, 2, 1])


def bert():
    return kb.models.BertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=32, dropout=0.0)


def model_inputs(batch=4, length=7):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, len(VOCAB), (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[-1, length - 2:] = 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def with_activation(task, activation, **kwargs):
    """`task`'s class and config with another `activation`, and `task`'s weights."""
    config = dict(task.get_config(), activation=activation, **kwargs)
    other = type(task).from_config(config)
    other.set_weights(task.get_weights())
    return other


def h5_layout(path):
    """{dataset path: shape} of a weights file, but for our record of its digests."""
    import h5py

    found = {}
    with h5py.File(path, "r") as h5:
        h5.visititems(lambda name, obj: found.__setitem__(name, obj.shape)
                      if isinstance(obj, h5py.Dataset) and "record" not in name else None)
    return found


@pytest.fixture(scope="module")
def pair():
    """A 3-class softmax TextClassifier and the same weights with activation=None."""
    keras.utils.set_random_seed(0)
    soft = kb.tasks.TextClassifier(bert(), num_classes=3, activation="softmax")
    return soft, with_activation(soft, None)


@pytest.mark.multibackend
def test_activation_is_applied_after_the_same_logits(pair):
    """keras-hub's `activation="softmax"` was a TypeError; it applies the activation to the
    logits: the weights, their paths and the layers are those of `activation=None`, with a
    weightless `output_activation` last; `logits(x)` gives the logits before it."""
    soft, plain = pair
    x = model_inputs()
    assert soft.activation is keras.activations.softmax and plain.activation is None
    assert [w.path for w in soft.weights] == [w.path for w in plain.weights]
    assert [layer.name for layer in soft.layers] == [layer.name for layer in plain.layers] + [
        "output_activation"]
    logits = to_numpy(plain(x, training=False))
    probabilities = to_numpy(soft(x, training=False))
    np.testing.assert_allclose(probabilities, to_numpy(keras.ops.softmax(logits)), atol=1e-6)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(to_numpy(soft.logits(x)), logits, atol=1e-6)
    np.testing.assert_allclose(to_numpy(plain.logits(x)), logits, atol=1e-6)
    # keras-hub's forms: a callable, "linear" (logits), and a clear error for a wrong name
    backbone = soft.backbone
    assert kb.tasks.TextClassifier(backbone, activation=keras.activations.softmax
                                   ).activation is keras.activations.softmax
    assert kb.tasks.TextClassifier(backbone, activation="linear").activation is None
    with pytest.raises(ValueError, match=r"TextClassifier\(activation='softmaxx'\): expected "
                                         r"None \(logits\), the name of a Keras activation"):
        kb.tasks.TextClassifier(backbone, activation="softmaxx")
    # other tasks return logits, as keras-hub's have no activation=
    with pytest.raises(TypeError, match=r"TokenClassifier got unexpected keyword argument\(s\) "
                                        r"\['activation'\] \(the task returns logits"):
        kb.tasks.TokenClassifier(backbone, num_classes=3, activation="softmax")


@pytest.mark.multibackend
def test_activation_is_saved_in_configs_keras_files_and_weights_files(pair, tmp_path):
    """The activation is in get_config (keras-hub's serialized name) and a `.keras` file; a
    config without it (saved before) is activation=None; a weights file of either loads into
    the other (the weights compute the same logits; the check of settings such as the
    backbone's `activation` did not refuse it)."""
    soft, plain = pair
    x = model_inputs()
    config = soft.get_config()
    assert config["activation"] == "softmax" and plain.get_config()["activation"] is None
    assert kb.tasks.TextClassifier.from_config(config).activation is keras.activations.softmax
    older = {k: v for k, v in plain.get_config().items() if k != "activation"}
    assert kb.tasks.TextClassifier.from_config(older).activation is None

    soft.save(str(tmp_path / "soft.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "soft.keras"))
    assert loaded.activation is keras.activations.softmax
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(soft(x)), atol=1e-6)

    soft.save_weights(str(tmp_path / "soft.weights.h5"))
    plain.save_weights(str(tmp_path / "plain.weights.h5"))
    assert h5_layout(tmp_path / "soft.weights.h5") == h5_layout(tmp_path / "plain.weights.h5")
    other = with_activation(plain, None)
    other.set_weights([np.zeros_like(w) for w in other.get_weights()])
    other.load_weights(str(tmp_path / "soft.weights.h5"))
    np.testing.assert_allclose(to_numpy(other(x)), to_numpy(plain(x)), atol=1e-6)
    loaded.load_weights(str(tmp_path / "plain.weights.h5"))
    loaded.load_weights(str(tmp_path / "soft.keras"))  # a .keras file's config settings
    # the backbone's own activation is still checked
    relu = kb.tasks.TextClassifier(kb.models.BertBackbone(
        len(VOCAB), 1, 2, 16, 32, max_sequence_length=32, activation="relu"), num_classes=3,
        activation="softmax")
    with pytest.raises(ValueError, match=r"the backbone's activation is 'gelu' in the file, "
                                         r"'relu' in the model"):
        relu.load_weights(str(tmp_path / "soft.weights.h5"))


def test_from_preset_takes_the_tasks_activation_not_the_backbones(tmp_path):
    """`TextClassifier.from_preset(..., activation="softmax")` (keras.io's GLUE guide) is the
    output activation; the backbone keeps its own (`Backbone.from_preset(..., activation=)`
    still overrides the backbone's, with the preset's warning). A saved preset brings its
    activation back; another one given loads its weights without the warning of settings
    that change what the weights compute."""
    clf = kb.tasks.TextClassifier.from_preset("bert_tiny_en_uncased", num_classes=2,
                                              activation="softmax", load_weights=False)
    assert clf.activation is keras.activations.softmax and clf.backbone.activation == "gelu"
    assert kb.models.BertBackbone.from_preset("bert_tiny_en_uncased", activation="relu",
                                              load_weights=False).activation == "relu"

    keras.utils.set_random_seed(1)
    soft = kb.tasks.TextClassifier(bert(), num_classes=3, activation="softmax",
                                   preprocessor=ft.TextClassifierPreprocessor(
                                       kb.preprocessing.WordPieceTokenizer(VOCAB, lowercase=True),
                                       16))
    soft.save_to_preset(str(tmp_path / "preset"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        again = kb.tasks.TextClassifier.from_preset(str(tmp_path / "preset"))
        plain = kb.tasks.TextClassifier.from_preset(str(tmp_path / "preset"), activation=None)
    assert again.activation is keras.activations.softmax and plain.activation is None
    assert again.backbone.activation == plain.backbone.activation == "gelu"
    with pytest.warns(UserWarning, match="was saved with activation='gelu'"):
        relu = kb.models.BertBackbone.from_preset(str(tmp_path / "preset"), activation="relu")
    assert relu.activation == "relu"
    probabilities = again.predict(TEXTS, verbose=0)
    # the saved task and the logits of the same weights, called directly (no predict traces)
    x = {k: to_numpy(v) for k, v in soft.preprocessor(TEXTS).items()}
    np.testing.assert_allclose(probabilities, to_numpy(soft(x)), atol=1e-6)
    np.testing.assert_allclose(probabilities, to_numpy(keras.ops.softmax(plain(x))), atol=1e-6)


@pytest.mark.multibackend
def test_default_loss_reads_softmax_outputs_as_probabilities(pair):
    """The default loss took the outputs for logits: on probabilities that is another loss
    (and another gradient). With "softmax" it is the cross-entropy of the probabilities, that
    of the logits of the same weights (and keras-hub's SparseCategoricalCrossentropy() of the
    same probabilities); an activation it cannot read is refused by compile() and by fit /
    evaluate (which compile with the defaults), asking for a loss."""
    soft, plain = pair
    x = model_inputs()
    for task in (soft, plain):
        task.compile()
    soft_loss, soft_accuracy = soft.evaluate(x, LABELS, verbose=0)
    plain_loss, plain_accuracy = plain.evaluate(x, LABELS, verbose=0)
    assert soft_loss == pytest.approx(plain_loss, abs=1e-5) and soft_accuracy == plain_accuracy
    keras_hub_loss = keras.losses.SparseCategoricalCrossentropy()(
        LABELS, soft(x, training=False))
    assert soft_loss == pytest.approx(float(keras_hub_loss), abs=1e-5)

    sigmoid = with_activation(soft, "sigmoid")
    message = (r"TextClassifier\(activation='sigmoid'\): the default loss is the softmax "
               r"cross-entropy of the logits.*compile\(loss=\.\.\.\)")
    with pytest.raises(ValueError, match=message):
        sigmoid.compile()
    with pytest.raises(ValueError, match=message):
        sigmoid.evaluate(x, LABELS, verbose=0)
    sigmoid.compile(loss=keras.losses.SparseCategoricalCrossentropy())  # the user's own loss
    log_softmax = with_activation(soft, "log_softmax")  # logits up to a shift: the same loss
    log_softmax.compile()
    assert log_softmax.evaluate(x, LABELS, verbose=0)[0] == pytest.approx(plain_loss, abs=1e-5)
    regression = kb.tasks.TextClassifier(soft.backbone, num_classes=1, activation="sigmoid")
    regression.compile()  # the MSE of the outputs, whatever the activation


def test_head_importance_and_pruning_read_the_logits_loss():
    """The analysis tools take the task's own loss: with activation="softmax" the same head
    importance as the logits of the same weights; an activation the loss cannot read is
    refused; a pruned task keeps its activation."""
    keras.utils.set_random_seed(2)
    tok = kb.preprocessing.WordPieceTokenizer(VOCAB, lowercase=True)
    soft = kb.tasks.TextClassifier(bert(), num_classes=3, activation="softmax",
                                   preprocessor=ft.TextClassifierPreprocessor(tok, 16))
    plain = with_activation(soft, None, preprocessor=soft.preprocessor)
    ours = kb.analysis.head_importance(soft, (TEXTS, LABELS), accuracy_drop=False)
    theirs = kb.analysis.head_importance(plain, (TEXTS, LABELS), accuracy_drop=False)
    np.testing.assert_allclose(ours.raw, theirs.raw, rtol=1e-4, atol=1e-7)
    assert ours.baseline == pytest.approx(theirs.baseline)
    with pytest.raises(ValueError, match=r"activation='sigmoid'"):
        kb.analysis.head_importance(
            with_activation(soft, "sigmoid", preprocessor=soft.preprocessor), (TEXTS, LABELS),
            accuracy_drop=False)
    pruned = kb.analysis.prune_heads(soft, {0: [1]})
    assert pruned.activation is keras.activations.softmax
    np.testing.assert_allclose(to_numpy(pruned(pruned.preprocessor(TEXTS))).sum(-1), 1.0,
                               atol=1e-6)


@pytest.mark.multibackend
def test_hf_export_writes_the_logits_head_and_says_the_activation_is_left(pair, tmp_path):
    """HF's *ForSequenceClassification returns logits: the export writes the same weights
    (HF's logits are ours before the activation) and warns that the activation is not in it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    soft, plain = pair
    with pytest.warns(UserWarning, match=r"TextClassifier\(activation='softmax'\).*HF's "
                                         r"BertForSequenceClassification returns the logits"
                      ) as caught:
        out = kb.presets.export_to_transformers(soft, str(tmp_path / "hf"))
    assert [w.filename for w in caught if "returns the logits" in str(w.message)] == [__file__]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    x = model_inputs()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                    token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long)).logits
    np.testing.assert_allclose(theirs.numpy(), to_numpy(plain(x, training=False)), atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        kb.presets.export_to_transformers(plain, str(tmp_path / "plain"))


@pytest.mark.multibackend
def test_distiller_refuses_a_classifier_by_name(pair):
    """The Distiller distils masked-LM logits; a TextClassifier (with an activation, its
    probabilities) as teacher or student was an AttributeError ('TextClassifier' object has no
    attribute 'token_embedding'): a TypeError naming it and the fix."""
    soft, _ = pair
    for teacher, student in ((soft, bert()), (bert(), soft)):
        role = "teacher" if teacher is soft else "student"
        with pytest.raises(TypeError, match=rf"its {role} is a MaskedLM or a backbone; got a "
                                            rf"TextClassifier\. Pass its backbone"):
            kb.tasks.Distiller(teacher, student)


@pytest.mark.multibackend
def test_the_output_activation_runs_in_float32_under_mixed_precision():
    """Under `mixed_float16` the logits are float16 (the backbone's compute dtype, as
    keras-hub's), but the activation runs in float32 (Keras' mixed-precision guide: a softmax
    in float16 rounds probabilities near 1 to 1 and small ones to 0, and the loss on them
    loses its gradient)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        task = kb.tasks.TextClassifier(bert(), num_classes=3, activation="softmax")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    x = model_inputs()
    probabilities = to_numpy(task(x))
    logits = to_numpy(task.logits(x))
    assert logits.dtype == np.float16 and probabilities.dtype == np.float32
    want = keras.ops.convert_to_numpy(keras.ops.softmax(logits.astype("float32")))
    np.testing.assert_allclose(probabilities, want, atol=1e-6)
