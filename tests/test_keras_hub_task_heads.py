"""keras-hub task directories (`task.save_to_preset`): the head weights (task.weights.h5) of
keras-hub's BERT / RoBERTa / ALBERT / DistilBERT `*TextClassifier` and `*MaskedLM` load into our
TextClassifier / MaskedLM, which then compute keras-hub's outputs; heads that do not load say why.

Tiny keras-hub tasks with random weights (head included) are saved by keras-hub into tmp.
"""
import json
import os
import re
import warnings

import keras
import keras_hub
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import default_corpus_documents, to_numpy
from keras_bertfam.presets import checkpoints, integrity

# One layer: the heads are the point here (a keras-hub backbone's layers in order, of every
# family: test_keras_hub_presets); each layer is built twice (keras-hub's and ours) and traced.
SIZES = dict(num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=32)
TEXTS = ["the film was a delight from start to end", "a dull, long and tired story",
         "pairs of words"]
LENGTH = 16


def _randomize(model):
    """Non-trivial values everywhere (LayerNorm gammas around 1, biases non-zero)."""
    for w in model.weights:
        rng = np.random.default_rng(len(w.path) + 7 * sum(map(ord, w.path)))
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32") +
                 (1.0 if w.path.endswith("gamma") else 0.0))


def _backbone(family, vocabulary_size):
    m = keras_hub.models
    if family == "albert":
        return m.AlbertBackbone(vocabulary_size=vocabulary_size, embedding_dim=8, **SIZES)
    cls = {"bert": m.BertBackbone, "roberta": m.RobertaBackbone,
           "distil_bert": m.DistilBertBackbone}[family]
    return cls(vocabulary_size=vocabulary_size, **SIZES)


PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distil_bert": "DistilBert"}


def _keras_hub_task(family, tokenizer, kind, **kwargs):
    m = keras_hub.models
    name = PREFIX[family] + kind
    preprocessor = getattr(m, name + "Preprocessor")(tokenizer, sequence_length=LENGTH)
    backbone = _backbone(family, tokenizer.vocabulary_size())
    if kind == "TextClassifier":
        kwargs.setdefault("num_classes", 3)
    task = getattr(m, name)(backbone, preprocessor=preprocessor, **kwargs)
    _randomize(task)
    return task


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """keras-hub tokenizers of each family: vocabularies of ~300 learned on a few reviews (BPE,
    SentencePiece), and WordPiece's of every word of the first 20 and of TEXTS, whole and
    lowercased (learning one took ~1.2 s: tf-text's learner is pure Python)."""
    out = tmp_path_factory.mktemp("vocabularies")
    # = default_corpus().take(60) (the same vocabularies), without starting its pipeline
    docs = [d.decode() for d in default_corpus_documents(0, 60)]
    m = keras_hub.models
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        set(re.findall(r"\w+|[^\w\s]", " ".join(docs[:20] + TEXTS).lower())))
    kb.preprocessing.train_byte_pair_vocabulary(docs, 300, output_dir=str(out))
    spm = str(out / "spiece.model")
    kb.preprocessing.train_sentencepiece_model(docs, 300, output_file=spm)
    # factories: a tokenizer per task (keras-hub's SentencePiece resource is not shared well)
    return {"bert": lambda: m.BertTokenizer(vocabulary=words, lowercase=True),
            "distil_bert": lambda: m.DistilBertTokenizer(vocabulary=words, lowercase=True),
            "roberta": lambda: m.RobertaTokenizer(vocabulary=str(out / "vocab.json"),
                                                  merges=str(out / "merges.txt")),
            "albert": lambda: m.AlbertTokenizer(proto=spm)}


@pytest.fixture(scope="module")
def saved_tasks(tokenizers, tmp_path_factory):
    """(family, kind) -> (the keras-hub task, its task directory)."""
    out = {}
    for family, tokenizer in tokenizers.items():
        for kind in ("TextClassifier", "MaskedLM"):
            task = _keras_hub_task(family, tokenizer(), kind)
            where = str(tmp_path_factory.mktemp(f"{family}_{kind}"))
            task.save_to_preset(where)
            out[family, kind] = task, where
    return out


def _head_warnings(caught):
    return [str(w.message) for w in caught if "head weights" in str(w.message)]


def _load_quietly(cls, where, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = cls.from_preset(where, **kwargs)
    assert not _head_warnings(caught)
    return ours


def _our_features(task, x):
    x = {k: to_numpy(v) for k, v in x.items()}
    if "segment_ids" in task.backbone.input and "segment_ids" not in x:  # keras-hub's RoBERTa
        x["segment_ids"] = np.zeros_like(x["token_ids"])
    return {k: v for k, v in x.items() if k in task.input}


def _check_same_outputs(theirs, ours, kind):
    if kind == "TextClassifier":  # raw strings through each one's own preprocessor
        # (keras-hub's eagerly: its ALBERT tokenizer's SentencePiece resource is not found in
        # its own `predict`'s tf.data pipeline once the tokenizer has run eagerly)
        expected = to_numpy(theirs(theirs.preprocessor(TEXTS), training=False))
        got = ours.predict(TEXTS, verbose=0)
    else:  # keras-hub's masking is random: the same masked inputs to both
        x = theirs.preprocessor(TEXTS)[0]
        expected = to_numpy(theirs(x, training=False))
        got = to_numpy(ours(_our_features(ours, x), training=False))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "distil_bert"])
@pytest.mark.parametrize("kind", ["TextClassifier", "MaskedLM"])
def test_keras_hub_task_head_loads(saved_tasks, family, kind):
    theirs, where = saved_tasks[family, kind]
    ours = _load_quietly(getattr(kb.tasks, kind), where)
    _check_same_outputs(theirs, ours, kind)
    if kind == "TextClassifier":
        assert ours.num_classes == 3 and ours.dropout == theirs.dropout
    if family == "roberta":  # the generic Task.from_preset (keras-hub's) loads it too
        _check_same_outputs(theirs, _load_quietly(kb.tasks.Task, where), kind)


@pytest.mark.multibackend
@pytest.mark.parametrize("kind", ["TextClassifier", "MaskedLM"])
def test_keras_hub_distil_bert_head_loads(tmp_path, kind):
    """On every backend (hand-made vocabulary: no tokenizer training)."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        set(" ".join(TEXTS).replace(",", " ,").split()))
    theirs = _keras_hub_task("distil_bert", keras_hub.models.DistilBertTokenizer(
        vocabulary=vocabulary, lowercase=True), kind)
    theirs.save_to_preset(str(tmp_path))
    ours = _load_quietly(getattr(kb.tasks, kind), str(tmp_path))
    _check_same_outputs(theirs, ours, kind)


@pytest.mark.parametrize("kind", ["TextClassifier", "MaskedLM"])
def test_head_loads_without_a_keras_hub_task(saved_tasks, monkeypatch, kind):
    """The head's weights are read from task.weights.h5 itself: no keras-hub task (and no second
    keras-hub backbone, a base model's 440 MB) is built for them. The one keras-hub backbone is
    load_backbone's, which reads model.weights.h5."""
    built = []
    for cls in (keras_hub.models.Task, keras_hub.models.Backbone):
        def counting(self, *args, _init=cls.__init__, _cls=cls, **kwargs):
            built.append(_cls.__name__)
            _init(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__init__", counting)
    theirs, where = saved_tasks["bert", kind]
    ours = _load_quietly(getattr(kb.tasks, kind), where)
    assert built == ["Backbone"]
    monkeypatch.undo()
    _check_same_outputs(theirs, ours, kind)


def test_loaded_head_saves_and_overrides_warn(saved_tasks, tmp_path):
    """Ours saved again keeps keras-hub's head settings; overriding one warns."""
    theirs, where = saved_tasks["bert", "MaskedLM"]
    ours = _load_quietly(kb.tasks.MaskedLM, where)
    assert (ours.head_activation, ours.head_layer_norm_epsilon) == ("gelu", 1e-5)
    ours.save_to_preset(str(tmp_path))
    _check_same_outputs(theirs, _load_quietly(kb.tasks.MaskedLM, str(tmp_path)), "MaskedLM")
    with pytest.warns(UserWarning, match="saved with head_activation='gelu'.*computes something"):
        kb.tasks.MaskedLM.from_preset(where, head_activation="relu")


def test_without_weights_no_head(saved_tasks):
    theirs, where = saved_tasks["bert", "TextClassifier"]
    ours = _load_quietly(kb.tasks.TextClassifier, where, load_weights=False,
                         sequence_length=LENGTH)
    assert ours.num_classes == 2  # nothing of the task is read
    assert np.abs(to_numpy(ours.head.kernel) -
                  to_numpy(theirs.output_dense.kernel)[:, :2]).max() > 0.01


def test_other_arguments_give_a_new_head(saved_tasks):
    """Arguments whose head is not keras-hub's (more classes; a hidden layer): the head is new,
    with a warning, the backbone loaded."""
    theirs, where = saved_tasks["bert", "TextClassifier"]
    for kwargs in ({"num_classes": 4}, {"hidden_activation": "tanh"}):
        with pytest.warns(UserWarning, match="the head is new"):
            ours = kb.tasks.TextClassifier.from_preset(where, **kwargs)
        kernel = to_numpy(ours.backbone.pooler_dense.kernel)
        np.testing.assert_array_equal(kernel, to_numpy(theirs.backbone.pooled_dense.kernel))


def test_a_head_of_another_task_warns(saved_tasks):
    _, where = saved_tasks["bert", "MaskedLM"]
    with pytest.warns(UserWarning, match=r"keras-hub BertMaskedLM.*not its head weights "
                                         r"\(task.weights.h5\): its head is a MaskedLM's"):
        kb.tasks.TextClassifier.from_preset(where, num_classes=2, sequence_length=LENGTH)


def test_a_softmax_classifier_loads_with_its_activation(tokenizers, tmp_path):
    """keras-hub's `activation="softmax"` (keras.io's GLUE guide): ours is built with it, the
    head loaded, the same probabilities."""
    theirs = _keras_hub_task("bert", tokenizers["bert"](), "TextClassifier",
                             activation="softmax")
    theirs.save_to_preset(str(tmp_path))
    ours = _load_quietly(kb.tasks.TextClassifier, str(tmp_path))
    assert ours.activation is keras.activations.softmax
    _check_same_outputs(theirs, ours, "TextClassifier")


def test_head_we_cannot_compute_warns(tokenizers, tmp_path):
    family, reason = "roberta", "hidden_dim=12"
    theirs = _keras_hub_task(family, tokenizers[family](), "TextClassifier", hidden_dim=12)
    theirs.save_to_preset(str(tmp_path))
    name = PREFIX[family] + "TextClassifier"
    with pytest.warns(UserWarning, match=f"keras-hub {name}.*not its head weights.*{reason}"):
        ours = kb.tasks.TextClassifier.from_preset(str(tmp_path))
    theirs, ours = to_numpy(theirs.output_dense.kernel), to_numpy(ours.head.kernel)
    assert theirs.shape != ours.shape or np.abs(theirs - ours).max() > 0.01  # not loaded


def _copy_of(where, tmp_path):
    import shutil

    shutil.copytree(where, tmp_path / "copy")
    return tmp_path / "copy"


def test_damaged_head_weights_name_the_file(saved_tasks, tmp_path):
    where = _copy_of(saved_tasks["bert", "TextClassifier"][1], tmp_path)
    weights = where / "task.weights.h5"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    with pytest.raises(integrity.IntegrityError, match="task.weights.h5.*damaged"):
        kb.tasks.TextClassifier.from_preset(str(where))


def test_non_finite_head_weight_names_the_tensor(tokenizers, tmp_path):
    theirs = _keras_hub_task("bert", tokenizers["bert"](), "TextClassifier")
    kernel = to_numpy(theirs.output_dense.kernel).copy()
    kernel[0, 0] = np.nan
    theirs.output_dense.kernel.assign(kernel)
    theirs.save_to_preset(str(tmp_path))
    with pytest.raises(integrity.IntegrityError, match=r"task.weights.h5.*'logits/kernel'.*NaN"):
        kb.tasks.TextClassifier.from_preset(str(tmp_path))


def test_a_head_weight_left_over_names_it(saved_tasks, tmp_path):
    """An array of task.weights.h5 that no weight of ours takes is an error, not dropped."""
    import h5py

    where = _copy_of(saved_tasks["bert", "TextClassifier"][1], tmp_path)
    with h5py.File(where / "task.weights.h5", "a") as f:
        f["layers/dense/vars/2"] = np.zeros(3, "float32")
    with pytest.raises(checkpoints.CheckpointError, match=r"task.weights.h5.*TextClassifier has "
                                                          r"no place for.*\['logits/2'\]"):
        kb.tasks.TextClassifier.from_preset(str(where))


def test_bfloat16_head_loads(tokenizers, tmp_path):
    """A keras-hub task saved in bfloat16 (Keras marks those arrays in the file): its head's
    values load."""
    import h5py

    m, tokenizer = keras_hub.models, tokenizers["bert"]()
    theirs = m.BertTextClassifier(
        m.BertBackbone(vocabulary_size=tokenizer.vocabulary_size(), dtype="bfloat16", **SIZES),
        num_classes=3,
        preprocessor=m.BertTextClassifierPreprocessor(tokenizer, sequence_length=LENGTH))
    _randomize(theirs)
    theirs.save_to_preset(str(tmp_path))
    with h5py.File(tmp_path / "task.weights.h5") as f:
        assert f["layers/dense/vars/0"].attrs["dtype"] == "bfloat16"
    ours = _load_quietly(kb.tasks.TextClassifier, str(tmp_path))
    np.testing.assert_array_equal(to_numpy(ours.head.kernel),
                                  to_numpy(keras.ops.cast(theirs.output_dense.kernel, "float32")))


def test_head_not_matching_task_json_names_the_file(saved_tasks, tmp_path):
    where = _copy_of(saved_tasks["distil_bert", "TextClassifier"][1], tmp_path)
    with open(where / "task.json") as f:
        config = json.load(f)
    config["config"]["num_classes"] = 5
    with open(where / "task.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"task.weights.h5.*does not match task.json.*logits"):
        kb.tasks.TextClassifier.from_preset(str(where))
    assert os.path.exists(where / "task.weights.h5")
