"""keras.io "Loading HuggingFace Transformers checkpoints into multi-backend KerasHub models"
(guides/keras_hub/hugging_face_keras_integration.py), ported as a conformance test.

The guide loads HF checkpoints with `from_preset("hf://...")`, runs them, fine-tunes with `fit`,
saves with `save_to_preset`, uploads with `upload_preset`, and loads one under a bfloat16 dtype
policy. Its models are Gemma and Llama 3 (causal LMs), neither a family of this library; the
same calls run here on a BERT checkpoint (HF transformers' `BertForMaskedLM`, tiny and randomly
initialized, saved with `save_pretrained`: nothing downloads), with `kb.tasks.MaskedLM` for
`GemmaCausalLM` (a task with the checkpoint's own LM head).

Sections of the guide and what happened to them:
- Setup, "KerasHub built-in HuggingFace transformers converters": `from_preset("hf://<id>")`
  through the local HF cache (the checkpoint put there as huggingface_hub lays it out); an id
  that is not there is a clear error naming the URI and how to load a local directory
  (tests/test_keras_io_upload.py, `test_load_a_handle_that_is_not_here`).
- "Let us try running some inference" (`generate`): no causal LM here; the MLM's predictions
  are compared with transformers' on the same checkpoint instead.
- "Fine-tuning ... using the Keras model.fit(...) API": ported (`fit(x=features,
  batch_size=2)`).
- "Saving and uploading the new checkpoint": `save_to_preset`, then `kb.presets.upload_preset`
  (keras-hub's refuses our directories: tests/test_keras_io_upload.py) with the HF transport
  stubbed; the saved preset reloads to the same predictions.
- "Run transformer models in JAX backend": the suite's backend. TensorFlow only in `make test`:
  what is checked is preset loading (backend-independent); on JAX the file took 46 s (XLA
  compiles), on torch 11 s, both passing when run by hand.
- "Changing precision" (`keras.config.set_dtype_policy("bfloat16")` before `from_preset`):
  ported.
- "Generation" with Llama 3: not ported (no causal LM family here).
"""
import sys

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import to_numpy
from test_presets import _fake_hub_cache

FEATURES = ["The quick brown fox jumped.", "I forgot my homework."]
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox",
              "jumped", ".", "i", "forgot", "my", "homework"]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A tiny random HF BertForMaskedLM directory (config, weights, vocab.txt) and its model."""
    import torch
    import transformers

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf_bert")
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(VOCABULARY), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=128)).eval()
    model.save_pretrained(str(path))
    (path / "vocab.txt").write_text("\n".join(VOCABULARY) + "\n")
    return str(path), model


@pytest.fixture
def hf_cache(hf_checkpoint, tmp_path, monkeypatch):
    """The checkpoint in the local HF cache as "someorg/tiny-bert", offline."""
    cache = str(tmp_path / "hub")
    _fake_hub_cache(cache, "someorg/tiny-bert", hf_checkpoint[0])
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _mask_logits(masked_lm, hf_model):
    """Ours and transformers' logits at the [MASK] of "[CLS] the quick [MASK] fox . [SEP]"."""
    import torch

    ids = np.array([[2, 5, 6, 4, 8, 10, 3]], "int32")
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
              "padding_mask": np.ones_like(ids), "mask_positions": np.array([[3]], "int32")}
    ours = to_numpy(masked_lm(inputs))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(ids, dtype=torch.long)).logits[:, 3].numpy()
    return ours.reshape(theirs.shape).astype("float32"), theirs


def test_load_fine_tune_save_and_upload(hf_checkpoint, hf_cache, tmp_path, monkeypatch):
    hf_model = hf_checkpoint[1]
    # not a keras checkpoint, it is a HF transformer checkpoint
    masked_lm = kb.tasks.MaskedLM.from_preset("hf://someorg/tiny-bert", sequence_length=16)
    ours, theirs = _mask_logits(masked_lm, hf_model)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    # The local directory itself loads the same.
    local = kb.tasks.MaskedLM.from_preset(hf_checkpoint[0], sequence_length=16)
    np.testing.assert_allclose(_mask_logits(local, hf_model)[0], ours, atol=1e-6)

    history = masked_lm.fit(x=FEATURES, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"][0])
    tuned = _mask_logits(masked_lm, hf_model)[0]
    assert np.abs(tuned - ours).max() > 0  # the step changed the weights

    preset_dir = str(tmp_path / "bert-tiny-finetuned")
    masked_lm.save_to_preset(preset_dir)
    calls = []

    class HubTransport:  # huggingface_hub's upload calls, recorded; nothing is sent
        def create_repo(self, repo_id, exist_ok=False, **kwargs):
            calls.append(("create_repo", repo_id))
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def upload_folder(self, repo_id, folder_path, **kwargs):
            calls.append(("upload_folder", repo_id, folder_path))

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "huggingface_hub", HubTransport())
        kb.presets.upload_preset("hf://someone/bert-tiny-finetune", preset_dir)
    assert calls == [("create_repo", "someone/bert-tiny-finetune"),
                     ("upload_folder", "someone/bert-tiny-finetune", preset_dir)]
    reloaded = kb.tasks.MaskedLM.from_preset(preset_dir)
    np.testing.assert_allclose(_mask_logits(reloaded, hf_model)[0], tuned, atol=1e-6)


def test_changing_precision(hf_checkpoint):
    keras.config.set_dtype_policy("bfloat16")
    try:
        masked_lm = kb.tasks.MaskedLM.from_preset(hf_checkpoint[0], sequence_length=16)
    finally:
        keras.config.set_dtype_policy("float32")
    assert masked_lm.backbone.dtype_policy.name == "bfloat16"
    assert all(w.dtype == "bfloat16" for w in masked_lm.backbone.weights)
    ours, theirs = _mask_logits(masked_lm, hf_checkpoint[1])
    assert np.abs(ours - theirs).max() < 0.1 * np.abs(theirs).max()  # bfloat16's precision
