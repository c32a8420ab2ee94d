"""ELECTRA: backbone parity with HF, presets, the corruption functions, the pretrainer."""
import importlib
import os

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from keras_bertfam.tasks.electra_pretrainer import (
    ElectraPretrainer,
    electra_generator,
    gumbel_sample,
    replace_at_positions,
)
from tests.conftest import to_numpy

# One layer: nothing here depends on the depth (the generator takes the discriminator's), and
# each layer is traced (TF) or compiled (JAX) again by every model built.
TINY = dict(vocabulary_size=60, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
            embedding_dim=16, max_sequence_length=16)


def batch(seed=0, b=4, t=10):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, 60, (b, t)).astype("int32")
    ids[:, 0] = 2
    positions = np.tile(np.array([[2, 4, 7]], "int32"), (b, 1))
    mask_ids = np.take_along_axis(ids, positions, 1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, 1)
    padding = np.ones_like(ids)
    padding[0, 8:] = 0
    weights = np.ones(positions.shape, "float32")
    positions[1, 2], weights[1, 2] = 0, 0.0  # a padding slot
    x = {"token_ids": masked, "segment_ids": np.zeros_like(ids), "padding_mask": padding,
         "mask_positions": positions}
    return x, mask_ids, weights


# === Pure functions ===
@pytest.mark.multibackend
def test_gumbel_sample_follows_softmax():
    probs = np.array([0.5, 0.3, 0.15, 0.05], "float32")
    logits = np.tile(np.log(probs) + 3.0, (20000, 1))  # a shift changes nothing
    samples = to_numpy(gumbel_sample(logits, seed=keras.random.SeedGenerator(3)))
    freq = np.bincount(samples, minlength=4) / len(samples)
    np.testing.assert_allclose(freq, probs, atol=0.015)
    # Temperature sharpens: T -> 0 is argmax.
    cold = to_numpy(gumbel_sample(logits[:500], seed=4, temperature=1e-3))
    assert (cold == 0).all()


@pytest.mark.multibackend
def test_replace_at_positions():
    ids = np.arange(12, dtype="int32").reshape(2, 6)
    out = to_numpy(replace_at_positions(ids, [[1, 4], [0, 5]], [[90, 91], [92, 93]],
                                        weights=[[1, 1], [0, 1]]))
    np.testing.assert_array_equal(out, [[0, 90, 2, 3, 91, 5], [6, 7, 8, 9, 10, 93]])
    # A position given twice (model inputs written by hand; maskers never repeat one) takes the
    # first weighted slot's value: the values were summed, an id past the vocabulary (326 of
    # 300 in an ElectraPretrainer's discriminator embedding).
    out = to_numpy(replace_at_positions(ids, [[4, 4, 4, 0], [2, 2, 3, 3]],
                                        [[90, 91, 92, 93], [94, 95, 96, 97]],
                                        weights=[[0, 1, 1, 0], [1, 1, 1, 1]]))
    np.testing.assert_array_equal(out, [[0, 1, 2, 3, 91, 5], [6, 7, 94, 96, 10, 11]])


def test_generator_size():  # (one layer each: the widths scale, not the depth)
    disc = kb.models.ElectraBackbone(60, 1, 4, 256, 128, 1024)
    gen = electra_generator(disc, 0.25)
    assert (gen.hidden_dim, gen.num_heads, gen.intermediate_dim, gen.embedding_dim) == (
        64, 1, 256, 128)
    gen = electra_generator(kb.models.ElectraBackbone(60, 1, 12, 768, None, 3072), 1 / 3)
    assert (gen.hidden_dim, gen.num_heads, gen.intermediate_dim) == (256, 4, 1024)


# === Backbone ===
def _hf_electra(tmp_path, **overrides):
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    cfg = dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=37, max_position_embeddings=20)
    cfg.update(overrides)
    torch.manual_seed(0)
    model = transformers.ElectraModel(transformers.ElectraConfig(**cfg)).eval()
    path = str(tmp_path / "hf_electra")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("embedding_size", [16, 32])
def test_hf_parity(tmp_path, embedding_size):
    import torch

    hf, path = _hf_electra(tmp_path, embedding_size=embedding_size)
    ours = kb.presets.convert(path)
    assert isinstance(ours, kb.models.ElectraBackbone)
    assert (ours.embeddings.projection is None) == (embedding_size == 32)
    ids = np.random.RandomState(0).randint(0, 99, (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    segments = np.zeros_like(ids)
    segments[0, 5:] = 1
    out = to_numpy(ours({"token_ids": ids, "segment_ids": segments, "padding_mask": mask})[
        "sequence_output"])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(segments)).last_hidden_state.numpy()
    assert np.abs(out - ref)[mask.astype(bool)].max() <= 1e-4
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


def test_small_discriminator_params_equal_hf():
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    ours = kb.models.ElectraBackbone.from_preset("electra_small_discriminator_uncased_en",
                                                 load_weights=False)
    with torch.device("meta"):  # shapes only: no weights to allocate and initialize
        hf = transformers.ElectraModel(transformers.ElectraConfig(
            vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
            num_attention_heads=4, intermediate_size=1024))
    n = sum(p.numel() for p in hf.parameters())
    assert ours.num_params() == n == kb.presets.get(
        "electra_small_discriminator_uncased_en").params
    assert 13e6 < n < 15e6  # the paper's "14M"
    assert "pooled_output" not in ours.output


def test_presets_build():
    for name in [n for n, p in kb.presets.PRESETS.items() if p.family == "electra"]:
        assert kb.presets.count_params(name) == kb.presets.get(name).params, name
    preset = kb.presets.get("electra_small_generator_uncased_en")
    assert kb.models.ElectraBackbone(**preset.config).num_params() == preset.params


# === Pretrainer ===
def test_embeddings_are_shared():
    disc = kb.models.ElectraBackbone(**TINY)
    model = ElectraPretrainer(discriminator=disc)
    gen = model.generator
    for name in ("token_embedding", "position_embedding", "segment_embedding", "layer_norm"):
        assert getattr(gen.embeddings, name) is getattr(disc.embeddings, name)
    assert gen.embeddings.projection is not disc.embeddings.projection
    ids = {id(w) for w in model.weights}
    assert len(ids) == len(model.weights)  # shared tables counted once
    assert id(disc.token_embedding.embeddings) in {id(w) for w in gen.weights}
    # The generator's own (replaced) tables are gone from its weights.
    assert len(gen.weights) == len({id(w) for w in gen.weights})
    with pytest.raises(ValueError, match="embedding_dim"):
        ElectraPretrainer(generator=kb.models.ElectraBackbone(**dict(TINY, embedding_dim=8)),
                          discriminator=kb.models.ElectraBackbone(**TINY))


@pytest.mark.multibackend
def test_labels_are_exactly_the_replaced_positions():
    disc = kb.models.ElectraBackbone(**dict(TINY, dropout=0.0))
    model = ElectraPretrainer(discriminator=disc, seed=0)
    # A generator that always samples token 7.
    model.mlm_head.bias.assign(np.where(np.arange(60) == 7, 1e4, 0.0).astype("float32"))
    x, mask_ids, weights = batch()
    mask_ids[:, 0] = 7  # slot 0 samples its original: labelled original
    out = model(x)
    sampled = to_numpy(out["sampled_ids"])
    assert (sampled == 7).all()
    labels = to_numpy(model.rtd_labels(mask_ids, weights, out))
    expected = np.zeros(x["token_ids"].shape, "int32")
    for row in range(4):
        for slot in (1, 2):
            if weights[row, slot]:
                expected[row, x["mask_positions"][row, slot]] = int(mask_ids[row, slot] != 7)
    np.testing.assert_array_equal(labels, expected)
    assert labels[:, 2].sum() == 0  # the correct sample at position 2 is "original"
    # The discriminator saw the samples at the masked positions, the input elsewhere.
    corrupted, _ = model.sampler(x["token_ids"], x["mask_positions"], out["mlm_logits"])
    corrupted = to_numpy(corrupted)
    valid = x["mask_positions"] > 0
    for row in range(4):
        changed = x["mask_positions"][row][valid[row]]
        assert (corrupted[row, changed] == 7).all()
        keep = np.setdiff1d(np.arange(10), changed)
        np.testing.assert_array_equal(corrupted[row, keep], x["token_ids"][row, keep])


@pytest.mark.multibackend
def test_loss_falls():
    disc = kb.models.ElectraBackbone(**dict(TINY, dropout=0.0))
    model = ElectraPretrainer(discriminator=disc, seed=1)
    model.compile(learning_rate=3e-3)
    x, y, w = batch(b=8)
    history = model.fit(x, y, sample_weight=w, batch_size=8, epochs=12, verbose=0).history
    assert history["loss"][-1] < 0.8 * history["loss"][0]
    assert history["rtd_loss"][-1] < history["rtd_loss"][0]
    assert history["mlm_loss"][-1] < history["mlm_loss"][0]
    # y as a dict (the labels of BertPretrainer's format) trains too.
    model.fit(x, {"mask_ids": y, "mask_weights": w}, batch_size=8, epochs=1, verbose=0)


def test_loss_value():
    """total = MLM + 50 * mean BCE over non-pad tokens, by hand."""
    model = ElectraPretrainer(discriminator=kb.models.ElectraBackbone(**TINY), seed=2)
    x, y, w = batch()
    out = {k: to_numpy(v) for k, v in model(x).items()}
    loss, values = model.losses_and_metrics(y, out, w)
    labels = to_numpy(model.rtd_labels(y, w, out)).astype("float64")
    z = out["rtd_logits"].astype("float64")
    bce = np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))
    pad = x["padding_mask"]
    rtd = (bce * pad).sum() / pad.sum()
    np.testing.assert_allclose(to_numpy(values["rtd_loss"]), rtd, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(loss), to_numpy(values["mlm_loss"]) + 50 * rtd,
                               rtol=1e-5)


def test_save_reload(tmp_path):
    model = ElectraPretrainer(discriminator=kb.models.ElectraBackbone(**TINY), seed=5)
    x, _, _ = batch()
    path = str(tmp_path / "electra.keras")
    model.save(path)
    before = model.predict(x, verbose=0)
    loaded = keras.saving.load_model(path)
    after = loaded.predict(x, verbose=0)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], atol=1e-6, err_msg=key)
    assert loaded.generator.token_embedding is loaded.discriminator.token_embedding
    assert loaded.get_config()["generator_hidden_fraction"] == 0.25

    # The pretrained discriminator is a backbone fine-tuning tasks load.
    preset = str(tmp_path / "preset")
    model.save_to_preset(preset)
    backbone = kb.models.ElectraBackbone.from_preset(preset)
    features = {k: x[k] for k in backbone.input}
    np.testing.assert_allclose(
        to_numpy(backbone(features)["sequence_output"]),
        to_numpy(model.discriminator(features)["sequence_output"]), atol=1e-6)
    model.discriminator.save_to_preset(str(tmp_path / "disc"))
    assert kb.models.ElectraBackbone.from_preset(str(tmp_path / "disc")).num_params() == (
        model.discriminator.num_params())
    # A new pretrainer continues from the saved discriminator (generator rebuilt at 1/4).
    again = ElectraPretrainer.from_preset(preset, preprocessor=None)
    np.testing.assert_allclose(
        to_numpy(again.discriminator(features)["sequence_output"]),
        to_numpy(backbone(features)["sequence_output"]), atol=1e-6)
    assert again.generator.hidden_dim == 8


def test_a_bad_argument_fails_before_any_weights_are_read(tmp_path, monkeypatch):
    """ElectraPretrainer.from_preset builds the task on its two backbones before reading their
    weights: a bad argument is refused first."""
    from keras_bertfam.presets import checkpoints

    _, path = _hf_electra(tmp_path)

    def reads_weights(*args, **kwargs):
        raise AssertionError("weights read before the arguments were checked")

    monkeypatch.setattr(checkpoints, "load_state_dict", reads_weights)
    for generator in (None, path):
        with pytest.raises(TypeError, match=r"ElectraPretrainer got unexpected keyword "
                                            r"argument\(s\) \['mask_rate'\]"):
            ElectraPretrainer.from_preset(path, generator_preset=generator, preprocessor=None,
                                          mask_rate=0.2)
        with pytest.raises(AssertionError, match="weights read"):  # good ones: weights read
            ElectraPretrainer.from_preset(path, generator_preset=generator, preprocessor=None)


def test_pretrainer_preset_keeps_generator_and_heads(tmp_path):
    """`save_to_preset` saves the generator, its MLM head and the discriminator's head, as the
    other pretrainers save theirs: `from_preset` gives the same generator and discriminator
    logits, and the preset exports its heads the way `keras-bertfam export --heads` loads them
    (`from_preset(preset, **the saved task's config)`)."""
    import json

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    disc = kb.models.ElectraBackbone(**TINY)
    model = ElectraPretrainer(discriminator=disc, generator_hidden_fraction=0.5, rtd_weight=20.0,
                              seed=5, preprocessor=ElectraPretrainer.default_preprocessor(
                                  tok, disc, sequence_length=10))
    rng = np.random.default_rng(0)
    for w in model.weights:  # no head or generator weight at its initial value
        if "seed" not in w.path:
            w.assign(to_numpy(w) + rng.normal(0, 0.1, w.shape).astype(w.dtype))
    x, _, _ = batch()

    def logits(m):
        features = {k: x[k] for k in m.discriminator.input}
        generated = m.generator({k: features[k] for k in m.generator.input})["sequence_output"]
        return (to_numpy(m.mlm_head(generated, x["mask_positions"])),
                to_numpy(m.rtd_head(m.discriminator(features)["sequence_output"])))

    preset = str(tmp_path / "preset")
    model.save_to_preset(preset)
    again = ElectraPretrainer.from_preset(preset)
    for ours, theirs in zip(logits(model), logits(again)):
        np.testing.assert_allclose(theirs, ours, atol=1e-6)
    assert again.generator.hidden_dim == 16 and again.rtd_weight == 20.0
    assert again.generator.token_embedding is again.discriminator.token_embedding
    assert again.preprocessor.sequence_length == 10
    # the discriminator is still the backbone preset fine-tuning loads
    np.testing.assert_array_equal(
        to_numpy(kb.models.ElectraBackbone.from_preset(preset).token_embedding.embeddings),
        to_numpy(disc.token_embedding.embeddings))

    with open(os.path.join(preset, "keras_bertfam.json")) as f:
        saved = json.load(f)["task"]
    assert saved["class_name"] == "ElectraPretrainer"
    heads = ElectraPretrainer.from_preset(preset, **saved["config"])  # as the CLI's --heads
    for ours, theirs in zip(logits(model), logits(heads)):
        np.testing.assert_allclose(theirs, ours, atol=1e-6)
    if keras.backend.backend() == "tensorflow":
        names = kb.export.export_saved_model(heads, str(tmp_path / "export" / "1"))
        assert names == ["serving_default", "token_ids"]
