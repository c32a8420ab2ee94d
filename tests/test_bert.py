"""BertBackbone: HF parity (random-init and the real MiniLM), config round trip, bad input."""
import inspect
import os

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from keras_bertfam.presets import checkpoints
from tests.conftest import to_numpy

pytestmark = pytest.mark.multibackend
TINY = dict(vocabulary_size=120, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
            max_sequence_length=32)


def _inputs(vocab, batch=3, length=12, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, vocab, (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, length // 2:] = 0  # right padding
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, length // 3:] = 1
    return {"token_ids": ids, "segment_ids": seg, "padding_mask": mask}


def _hf_outputs(model_dir, x):
    import torch
    import transformers

    hf = transformers.BertModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(x["padding_mask"]),
                 token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long))
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _assert_parity(ours, hf_dir, x):
    seq, pooled = _hf_outputs(hf_dir, x)
    got = ours(x)
    valid = x["padding_mask"].astype(bool)
    diff = np.abs(to_numpy(got["sequence_output"]) - seq)[valid].max()
    assert diff <= 1e-4, diff
    assert np.abs(to_numpy(got["pooled_output"]) - pooled).max() <= 1e-4


def test_parity_with_random_hf_bert(tmp_path):
    import transformers

    cfg = transformers.BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    ours = kb.presets.convert(str(tmp_path))
    assert isinstance(ours, kb.models.BertBackbone)
    _assert_parity(ours, str(tmp_path), _inputs(120))


def test_parity_with_real_minilm(minilm_dir):
    ours = kb.models.BertBackbone.from_preset("all_minilm_l6_v2")
    _assert_parity(ours, minilm_dir, _inputs(30522, length=24, seed=1))


def test_config_round_trip_mirrors_constructor():
    backbone = kb.models.BertBackbone(**TINY)
    config = backbone.get_config()
    params = set(inspect.signature(kb.models.BertBackbone.__init__).parameters) - {"self",
                                                                                   "kwargs"}
    assert params <= set(config)
    again = kb.models.BertBackbone.from_config(config)
    assert again.get_config() == config
    x = _inputs(120)
    again.set_weights(backbone.get_weights())
    np.testing.assert_allclose(to_numpy(again(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


def test_variable_sequence_length_and_inspect():
    backbone = kb.models.BertBackbone(**TINY)
    for length in (3, 17):
        out = backbone(_inputs(120, length=length))
        assert tuple(out["sequence_output"].shape) == (3, length, 16)
    details = backbone.inspect(_inputs(120))
    assert len(details["hidden_states"]) == 3 and len(details["attention_probs"]) == 2
    np.testing.assert_allclose(to_numpy(details["sequence_output"]),
                               to_numpy(backbone(_inputs(120))["sequence_output"]), atol=1e-5)


def test_keras_save_round_trip(tmp_path):
    backbone = kb.models.BertBackbone(**TINY)
    path = os.path.join(tmp_path, "b.keras")
    backbone.save(path)
    again = keras.saving.load_model(path)
    x = _inputs(120)
    np.testing.assert_allclose(to_numpy(again(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


def test_preset_dir_round_trip(tmp_path):
    backbone = kb.models.BertBackbone(**TINY)
    backbone.save_to_preset(str(tmp_path))
    again = kb.models.BertBackbone.from_preset(str(tmp_path))
    x = _inputs(120)
    np.testing.assert_allclose(to_numpy(again(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


@pytest.mark.parametrize("bad", [dict(num_layers=0), dict(hidden_dim=15), dict(num_heads=2.0)])
def test_bad_config(bad):
    with pytest.raises(ValueError):
        kb.models.BertBackbone(**dict(TINY, **bad))


def test_corrupt_and_mismatched_checkpoints(tmp_path):
    import transformers

    cfg = transformers.BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    with pytest.raises(checkpoints.CheckpointError, match="Shape mismatch"):
        kb.presets.convert(str(tmp_path), hidden_dim=32, intermediate_dim=64)
    with open(os.path.join(tmp_path, "model.safetensors"), "wb") as f:
        f.write(b"not a safetensors file")
    with pytest.raises(checkpoints.CheckpointError, match="corrupt"):
        kb.presets.convert(str(tmp_path))


def test_unknown_preset_lists_near_names():
    with pytest.raises(ValueError, match="bert_tiny_en_uncased"):
        kb.models.BertBackbone.from_preset("bert_tiny_en_uncasd", load_weights=False)


def test_registered_param_counts_match_built_models():
    for name in ("bert_tiny_en_uncased", "bert_mini_en_uncased", "all_minilm_l6_v2"):
        backbone = kb.models.BertBackbone.from_preset(name, load_weights=False)
        assert backbone.num_params() == kb.presets.get(name).params
