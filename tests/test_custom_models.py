"""keras.io's "Getting Started with KerasHub", fine-tuning a custom model, on every family:

    preprocessor = XTextClassifierPreprocessor.from_preset(preset, sequence_length=...)
    backbone = XBackbone.from_preset(preset)
    inputs = backbone.input
    sequence = backbone(inputs)["sequence_output"]
    model = keras.Model(inputs, keras.layers.Dense(2)(...))
    model.fit(train_ds.map(preprocessor))

`ds.map(preprocessor)` must give exactly the keys of `backbone.input`: Keras' functional model
given a dict with another key matches it to its inputs BY POSITION (a RoBERTa model read
`segment_ids` as `token_ids`, silently), and one without a key fails (a Longformer model had no
`global_attention_mask`). A Longformer preprocessor gives the global attention the family's
task puts on its rows (`<s>` for a classifier), so a model of one's own computes what the task
computes.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import to_numpy
from test_preprocessors import _BPE, _MERGES, _TINY, _WORDS  # the tiny vocabularies
# family: (backbone class, tokenizer kind, extra backbone arguments)
FAMILIES = {
    "bert": (kb.models.BertBackbone, "wordpiece", {}),
    "roberta": (kb.models.RobertaBackbone, "byte_pair", {}),
    "albert": (kb.models.AlbertBackbone, "wordpiece", {"embedding_dim": 8}),
    "distil_bert": (kb.models.DistilBertBackbone, "wordpiece", {}),
    "electra": (kb.models.ElectraBackbone, "wordpiece", {"embedding_dim": 8}),
    "spanbert": (kb.models.SpanBertBackbone, "wordpiece", {}),
    "xlnet": (kb.models.XLNetBackbone, "xlnet", {}),
    "longformer": (kb.models.LongformerBackbone, "byte_pair", {"attention_window": 4}),
}
TEXTS = ["a quick fox", "the film", "a fox", "quick quick the film a"]
PAIRS = (["a quick fox", "the film"], ["a fox", "quick quick"])


@pytest.fixture(scope="module")
def xlnet_model_file(tmp_path_factory):
    """A tiny XLNet SentencePiece model (a path: the tokenizer is made in each test, after the
    per-test session reset that drops tf-text's SentencePiece resources)."""
    path = str(tmp_path_factory.mktemp("spm") / "xlnet.model")
    lines = [f"a quick fox and the film number {i}" for i in range(200)]
    kb.preprocessing.train_xlnet_sentencepiece_model(lines, 40, output_file=path)
    return path


def _tokenizer(kind, xlnet_model_file):
    if kind == "wordpiece":
        return kb.preprocessing.WordPieceTokenizer(_WORDS)
    if kind == "byte_pair":
        return kb.preprocessing.BytePairTokenizer(_BPE, _MERGES)
    return kb.preprocessing.XLNetTokenizer(xlnet_model_file)


@pytest.fixture(scope="module")
def presets(tmp_path_factory, xlnet_model_file):
    """A tiny backbone preset (with its tokenizer) of each family: {family: path}."""
    root = tmp_path_factory.mktemp("presets")
    paths = {}
    for family, (cls, kind, extra) in FAMILIES.items():
        config = dict(_TINY, **extra)
        if cls is kb.models.XLNetBackbone:
            config.pop("max_sequence_length")  # relative positions: no table
        tokenizer = _tokenizer(kind, xlnet_model_file)
        backbone = cls(vocabulary_size=tokenizer.vocabulary_size(), dropout=0.0, **config)
        pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12)
        paths[family] = str(root / family)
        kb.tasks.TextClassifier(backbone, num_classes=2,
                                preprocessor=pre).save_to_preset(paths[family])
    return paths


@pytest.fixture(scope="module")
def loaded(presets):
    """`{family: XBackbone.from_preset(presets[family])}`, each loaded once for the tests that
    only call it or build a task on it (the fine-tuning test loads its own: it trains)."""
    return {family: FAMILIES[family][0].from_preset(path) for family, path in presets.items()}


def _mapped(preprocessor, texts, labels=None):
    """One batch of `ds.map(preprocessor)`, as the guide feeds its model."""
    ds = tf.data.Dataset.from_tensor_slices(texts if labels is None else (texts, labels))
    return next(iter(ds.batch(len(TEXTS)).map(preprocessor)))


def _numpy(x):
    return {k: to_numpy(v) for k, v in x.items()}


@pytest.mark.multibackend
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_preset_preprocessor_gives_exactly_its_backbone_s_inputs(presets, loaded, family):
    """Every family: the keys of `ds.map(preprocessor)` are those of `backbone.input`, and a
    functional model over `backbone.input` computes what the backbone computes on them."""
    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(presets[family],
                                                                  sequence_length=12)
    backbone = loaded[family]
    x = _numpy(_mapped(pre, TEXTS))
    assert set(x) == set(backbone.input)
    inputs = backbone.input
    model = keras.Model(inputs, backbone(inputs)["sequence_output"])
    # a direct call matches the dict to the inputs as predict does (and traces no function)
    np.testing.assert_allclose(to_numpy(model(x)),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-5)
    if family == "longformer":
        # the global attention Longformer's TextClassifier derives in its graph: on `<s>`
        rule = backbone.task_global_attention(
            {k: v for k, v in x.items() if k != "global_attention_mask"}, "TextClassifier")
        np.testing.assert_array_equal(x["global_attention_mask"], to_numpy(rule))
        assert x["global_attention_mask"][:, 0].all() and not x["global_attention_mask"][
            :, 1:].any()


@pytest.mark.multibackend
def test_longformer_preprocessors_give_their_task_s_global_attention(presets, loaded):
    """Each fine-tuning preprocessor from a Longformer preset gives the global attention of its
    task (QA: the question; multiple choice: the choice; token classification and MLM: none);
    attached to a task, none (the task derives it); `global_attention_mask=` True / False
    forces it, and `get_config` keeps what the preset said."""
    path = presets["longformer"]
    backbone = loaded["longformer"]
    pre = kb.preprocessing.TokenClassifierPreprocessor.from_preset(path, sequence_length=12)
    x = _numpy(pre(tf.constant(TEXTS)))
    assert set(x) == set(backbone.input) and not x["global_attention_mask"].any()
    pre = kb.preprocessing.QuestionAnswererPreprocessor.from_preset(
        path, sequence_length=16, stride=8, max_question_length=4)
    x = pre((tf.constant(["a fox"]), tf.constant(["the quick fox a film"])))
    x = _numpy(x[0] if isinstance(x, tuple) else x)
    assert set(backbone.input) <= set(x)
    features = {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    rule = to_numpy(backbone.task_global_attention(features, "QuestionAnswerer"))
    assert rule.any()
    np.testing.assert_array_equal(x["global_attention_mask"], rule)
    pre = kb.preprocessing.MultipleChoicePreprocessor.from_preset(path, sequence_length=12)
    x = _numpy(pre((tf.constant(["the film"]), tf.constant([["a fox", "quick a"]]))))
    flat = {k: x[k].reshape(-1, 12) for k in ("token_ids", "segment_ids", "padding_mask")}
    rule = to_numpy(backbone.task_global_attention(flat, "MultipleChoice"))
    assert rule.any()
    np.testing.assert_array_equal(x["global_attention_mask"].reshape(-1, 12), rule)
    mlm = kb.preprocessing.MaskedLMPreprocessor.from_preset(path, sequence_length=12, seed=0)
    x = _numpy(mlm(tf.constant(TEXTS))[0])
    assert set(x) == set(backbone.input) | {"mask_positions"}
    assert not x["global_attention_mask"].any()

    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(path, sequence_length=12)
    config = dict(pre.get_config(), tokenizer=pre.tokenizer)
    assert config["global_attention_mask"] is True
    assert "global_attention_mask" in type(pre)(**config)(tf.constant(TEXTS))
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre)
    assert "global_attention_mask" not in pre(tf.constant(TEXTS))
    tokenizer = kb.preprocessing.BytePairTokenizer(_BPE, _MERGES)
    pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12)
    assert "global_attention_mask" not in pre(tf.constant(TEXTS))  # RoBERTa's or Longformer's
    pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12,
                                                      global_attention_mask=True)
    assert _numpy(pre(tf.constant(TEXTS)))["global_attention_mask"][:, 0].all()
    with pytest.raises(ValueError, match=r"global_attention_mask must be 'auto', True or "
                                         r"False, got 1"):
        kb.preprocessing.TextClassifierPreprocessor(tokenizer, global_attention_mask=1)
    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(
        path, sequence_length=12, global_attention_mask=False)
    assert "global_attention_mask" not in pre(tf.constant(TEXTS))


@pytest.mark.multibackend
@pytest.mark.parametrize("family", ["roberta", "longformer"])
def test_fine_tuning_a_custom_model(presets, family):
    """The guide's custom model, fit one step and predicted, on the two families whose
    preprocessors gave other keys than the backbone's inputs (RoBERTa: `segment_ids` too, read
    by position; Longformer: no `global_attention_mask`). The backbone part of the model
    computes what `backbone(preprocessor(x))` computes.

    Both keep HF's pooler (RoBERTa's: HF `RobertaModel`'s, which keras-hub's lacks; an HF
    checkpoint's pooler weights load into it). A model reading only `sequence_output` leaves it
    without gradients, which Keras warns of on TensorFlow and torch (as for keras-hub's BERT);
    README's remedy, `backbone.get_layer("pooler").trainable = False`, trains without it."""
    import warnings

    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(presets[family],
                                                                  sequence_length=12)
    backbone = FAMILIES[family][0].from_preset(presets[family])
    backbone.get_layer("pooler").trainable = False
    inputs = backbone.input
    sequence = backbone(inputs)["sequence_output"]
    outputs = keras.layers.Dense(2)(sequence[:, backbone.cls_token_index, :])
    model = keras.Model(inputs, outputs)
    # Keras' default jit_compile ("auto": jitted on JAX; on TensorFlow without a GPU and on
    # torch, not), as the guide compiles. On JAX, jit_compile=False ran the step eagerly, each
    # op and each AdamW update compiled on its own: this test's two cases took 7.3 s of CPU,
    # 2.9 s jitted (2026-11-29, load ~8).
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.AdamW(1e-3))
    ds = tf.data.Dataset.from_tensor_slices((TEXTS, [0, 1, 1, 0])).batch(4).map(pre)
    before = [to_numpy(w) for w in backbone.weights]
    pooler = [id(w) for w in backbone.get_layer("pooler").weights]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(ds, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert not [str(w.message) for w in caught
                if "Gradients do not exist" in str(w.message) and "pooler/" in str(w.message)]
    changed = [id(w) for b, w in zip(before, backbone.weights)
               if not np.array_equal(b, to_numpy(w))]
    assert changed and not set(changed) & set(pooler)
    assert "pooled_output" in backbone.output
    x = _numpy(next(iter(ds))[0])  # the features fit was given (no second trace of `pre`)
    got_sequence, got = keras.Model(inputs, [sequence, outputs])(x)  # Keras' matching too
    np.testing.assert_allclose(model.predict(x, verbose=0), to_numpy(got), atol=1e-5)
    np.testing.assert_allclose(to_numpy(got_sequence),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-5)


@pytest.mark.multibackend
def test_a_longformer_task_takes_its_own_global_attention_given(presets):
    """A Longformer task fed a preset preprocessor's output (`preprocessor=None`), which holds
    the global attention the task derives: the same logits as without it (in memory and from a
    dataset); another global attention would be ignored, and is refused."""
    path = presets["longformer"]
    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(path, sequence_length=12)
    clf = kb.tasks.TextClassifier.from_preset(path, num_classes=2, preprocessor=None)
    x = _numpy(_mapped(pre, TEXTS))
    assert "global_attention_mask" in x
    without = {k: v for k, v in x.items() if k != "global_attention_mask"}
    expected = clf.predict(without, verbose=0)
    np.testing.assert_allclose(clf.predict(x, verbose=0), expected, atol=1e-6)
    ds = tf.data.Dataset.from_tensor_slices((TEXTS, [0, 1, 1, 0])).batch(4).map(pre)
    assert np.isfinite(clf.evaluate(ds, verbose=0, return_dict=True)["loss"])
    other = dict(x, global_attention_mask=np.zeros_like(x["global_attention_mask"]))
    with pytest.raises(ValueError, match=r"TextClassifier puts its own global attention .* "
                                         r"differs from it in row 0 at position 0"):
        clf.predict(other, verbose=0)
