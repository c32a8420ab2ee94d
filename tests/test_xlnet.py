"""XLNet: relative attention, two streams, memory; HF XLNetModel parity; presets; PLM pretraining."""
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_bertfam import presets
from keras_bertfam.layers.relative_attention import (
    rel_shift,
    relative_positions,
    xlnet_attention_masks,
)
from keras_bertfam.models.xlnet import XLNetBackbone
from keras_bertfam.tasks.xlnet_pretrainer import XLNetPretrainer
from tests.conftest import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 99


def _hf_pair(tmp_path, **overrides):
    torch.manual_seed(0)
    cfg = dict(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=37, dropout=0.0)
    cfg.update(overrides)
    hf = transformers.XLNetModel(transformers.XLNetConfig(**cfg)).eval()
    # Random biases / LayerNorms so that a wrong mapping cannot hide behind zeros and ones.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(str(tmp_path))
    return hf, presets.convert(str(tmp_path))


def _inputs(batch=2, length=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (batch, length)).astype("int32")
    seg = np.array([[0, 0, 0, 1, 1, 1, 2][:length]] * batch, "int32")
    pad = np.ones((batch, length), "int32")
    pad[1, :2] = 0  # left padding, XLNet's side
    return ids, seg, pad


def _t(x):
    return torch.tensor(np.asarray(x))


@pytest.mark.multibackend
def test_rel_shift_picks_the_distance_of_each_query_key_pair():
    qlen, mlen = 3, 2
    klen = qlen + mlen
    pos = to_numpy(relative_positions(qlen, klen))[0]  # distances klen .. -qlen+1
    scores = np.broadcast_to(pos, (1, 1, qlen, klen + qlen)).astype("float32")
    shifted = to_numpy(rel_shift(ops.convert_to_tensor(scores), klen))[0, 0]
    expected = (mlen + np.arange(qlen))[:, None] - np.arange(klen)[None, :]
    np.testing.assert_array_equal(shifted, expected)


@pytest.mark.multibackend
def test_parity_plain_content_stream(tmp_path):
    hf, ours = _hf_pair(tmp_path)
    ids, seg, pad = _inputs()
    with torch.no_grad():
        ref = hf(_t(ids).long(), attention_mask=_t(pad).float(),
                 token_type_ids=_t(seg).long()).last_hidden_state.numpy()
    out = to_numpy(ours({"token_ids": ids, "segment_ids": seg, "padding_mask": pad})[
        "sequence_output"])
    m = pad.astype(bool)
    assert np.abs(out - ref)[m].max() <= 1e-4
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


@pytest.mark.multibackend
def test_parity_two_streams_with_perm_mask_and_target_mapping(tmp_path):
    hf, ours = _hf_pair(tmp_path)
    ids, seg, pad = _inputs()
    rng = np.random.default_rng(1)
    perm = rng.integers(0, 2, (2, 7, 7)).astype("float32")
    tm = np.zeros((2, 3, 7), "float32")
    for b in range(2):
        for p, t in enumerate(rng.choice(np.arange(2, 7), 3, replace=False)):
            tm[b, p, t] = 1
    with torch.no_grad():
        ref = hf(_t(ids).long(), attention_mask=_t(pad).float(), token_type_ids=_t(seg).long(),
                 perm_mask=_t(perm), target_mapping=_t(tm)).last_hidden_state.numpy()
    x = {"token_ids": ids, "segment_ids": seg, "padding_mask": pad, "perm_mask": perm,
         "target_mapping": tm}
    out = ours.forward({k: ops.convert_to_tensor(v) for k, v in x.items()})
    assert out["query_output"].shape == (2, 3, 32)
    assert np.abs(to_numpy(out["query_output"]) - ref).max() <= 1e-4


@pytest.mark.multibackend
def test_parity_with_memory_over_two_consecutive_segments(tmp_path):
    hf, ours = _hf_pair(tmp_path, mem_len=5)
    ids, seg, _ = _inputs()
    ids2, _, _ = _inputs(seed=5)
    with torch.no_grad():
        r1 = hf(_t(ids).long(), token_type_ids=_t(seg).long(), use_mems=True)
        r2 = hf(_t(ids2).long(), token_type_ids=_t(seg).long(), mems=r1.mems, use_mems=True)
    conv = lambda d: {k: ops.convert_to_tensor(v) for k, v in d.items()}
    o1 = ours.forward(conv({"token_ids": ids, "segment_ids": seg}), return_mems=True)
    o2 = ours.forward(conv({"token_ids": ids2, "segment_ids": seg}), mems=o1["mems"],
                      return_mems=True)
    assert len(o2["mems"]) == 2 and o2["mems"][0].shape == (2, 5, 32)
    assert np.abs(to_numpy(o1["sequence_output"]) - r1.last_hidden_state.numpy()).max() <= 1e-4
    assert np.abs(to_numpy(o2["sequence_output"]) - r2.last_hidden_state.numpy()).max() <= 1e-4
    for a, b in zip(o2["mems"], r2.mems):
        assert np.abs(to_numpy(a) - b.numpy().transpose(1, 0, 2)).max() <= 1e-4


@pytest.mark.multibackend
def test_parity_bi_data_clamp_len_shared_biases_and_tanh_gelu(tmp_path):
    hf, ours = _hf_pair(tmp_path, bi_data=True, clamp_len=3, untie_r=False,
                        ff_activation="gelu_new")
    # HF keeps a copy of the shared biases per layer; tie them as the original does.
    with torch.no_grad():
        for layer in hf.layer[1:]:
            for n in ("r_w_bias", "r_r_bias", "r_s_bias"):
                getattr(layer.rel_attn, n).copy_(getattr(hf.layer[0].rel_attn, n))
    hf.save_pretrained(str(tmp_path))
    ours = presets.convert(str(tmp_path))
    assert ours.bi_data and ours.clamp_len == 3 and not ours.untie_r
    ids, seg, pad = _inputs(batch=4)
    pad[1, :2] = 0
    with torch.no_grad():
        ref = hf(_t(ids).long(), attention_mask=_t(pad).float(),
                 token_type_ids=_t(seg).long()).last_hidden_state.numpy()
    out = to_numpy(ours({"token_ids": ids, "segment_ids": seg, "padding_mask": pad})[
        "sequence_output"])
    assert np.abs(out - ref)[pad.astype(bool)].max() <= 1e-4
    per_layer_biases = 3 * 32
    assert ours.num_params() == sum(p.numel() for p in hf.parameters()) - per_layer_biases


def _order_perm_mask(rank):
    """perm_mask of an order over all-target positions: i cannot see j unless rank[j] < rank[i]."""
    return (rank[None, :] >= rank[:, None]).astype("float32")


@pytest.mark.multibackend
def test_factorization_order_visibility_masks_and_attention_probabilities():
    from keras_bertfam.preprocessing.permutation import perm_mask_from_order
    import tensorflow as tf

    length = 6
    order = np.array([3, 0, 5, 1, 4, 2])  # factorization order: position 3 first, ...
    rank = np.empty(length, "int32")
    rank[order] = np.arange(length)
    perm = perm_mask_from_order(tf.constant(rank[None]), tf.ones([1, length], tf.bool),
                                tf.zeros([1, length], tf.bool)).numpy()
    np.testing.assert_array_equal(perm[0], _order_perm_mask(rank))
    content, query = xlnet_attention_masks(ops.ones((1, length)), ops.convert_to_tensor(perm))
    content, query = to_numpy(content)[0], to_numpy(query)[0]
    for i in range(length):
        for j in range(length):
            before = rank[j] < rank[i]
            assert query[i, j] == before, (i, j)
            assert content[i, j] == (before or i == j), (i, j)

    backbone = XLNetBackbone(VOCAB, 2, 2, 16, 32, dropout=0.0)
    tm = np.eye(length, dtype="float32")[None]  # predict every position
    x = {"token_ids": np.arange(10, 10 + length)[None].astype("int32"),
         "segment_ids": np.zeros((1, length), "int32"),
         "padding_mask": np.ones((1, length), "int32"), "perm_mask": perm,
         "target_mapping": tm}
    out = backbone.inspect(x)
    for probs_h, probs_g in zip(out["attention_probs"], out["query_attention_probs"]):
        ph, pg = to_numpy(probs_h)[0], to_numpy(probs_g)[0]  # (N, T, T)
        np.testing.assert_array_equal(ph > 0, np.broadcast_to(content, ph.shape))
        # The first position in the order sees nothing (uniform over blocked keys in XLNet, as
        # the original's -1e30 masking); every other row is positive exactly where allowed.
        first = order[0]
        rows = [i for i in range(length) if i != first]
        np.testing.assert_array_equal(pg[:, rows] > 1e-30, np.broadcast_to(query[rows],
                                                                           pg[:, rows].shape))


@pytest.mark.multibackend
def test_non_targets_are_visible_to_all_and_see_no_target():
    from keras_bertfam.preprocessing.permutation import perm_mask_from_order
    import tensorflow as tf

    rank = tf.constant([[2, 0, 1, 3, 5, 4]])
    is_target = tf.constant([[True, False, True, False, True, False]])
    is_func = tf.constant([[False, False, False, False, False, True]])  # <cls> at the end
    perm = perm_mask_from_order(rank, is_target, is_func).numpy()[0]
    for j in (1, 3):  # non-targets
        assert (perm[:, j] == 0).all()  # everyone sees them
        assert (perm[j, [0, 2, 4, 5]] == 1).all()  # they see no target / functional token
    assert perm[0, 0] == 1 and perm[2, 2] == 1  # targets do not see themselves
    assert perm[5, 5] == 0  # <cls> sees itself
    assert perm[2, 0] == 1 and perm[0, 2] == 0  # rank 1 cannot see rank 2; rank 2 sees rank 1
    assert perm[4, 0] == 0 and perm[0, 4] == 1  # rank 5 sees rank 2, not the reverse


def test_parameter_counts_of_presets_equal_hf():
    cfg = transformers.XLNetConfig
    with torch.device("meta"):
        hf_base = transformers.XLNetModel(cfg(vocab_size=32000, d_model=768, n_layer=12,
                                              n_head=12, d_inner=3072))
        hf_large = transformers.XLNetModel(cfg(vocab_size=32000, d_model=1024, n_layer=24,
                                               n_head=16, d_inner=4096))
    count = lambda m: sum(p.numel() for p in m.parameters())
    base, large = presets.get("xlnet_base_en"), presets.get("xlnet_large_en")
    assert base.params == count(hf_base) == 116_718_336
    assert large.params == count(hf_large)

    def formula(c):  # ours, by construction (checked against built models below)
        h, i, n = c["hidden_dim"], c["intermediate_dim"], c["num_layers"]
        per_layer = 5 * h * h + 3 * h + 2 * h + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        return c["vocabulary_size"] * h + h + n * per_layer

    assert formula(base.config) == base.params and formula(large.config) == large.params
    small = dict(vocabulary_size=50, num_layers=3, num_heads=2, hidden_dim=8,
                 intermediate_dim=12)
    assert XLNetBackbone(**small).num_params() == formula(small)  # the formula, built


def test_get_config_and_preset_round_trip(tmp_path):
    backbone = XLNetBackbone(VOCAB, 2, 2, 16, 32, mem_len=4, reuse_len=3, clamp_len=5,
                             untie_r=False, bi_data=True)
    config = backbone.get_config()
    import inspect

    params = set(inspect.signature(XLNetBackbone.__init__).parameters) - {"self", "kwargs"}
    assert params <= set(config)
    clone = XLNetBackbone.from_config(config)
    assert clone.get_config() == config and clone.num_params() == backbone.num_params()
    backbone.save_to_preset(str(tmp_path / "p"))
    loaded = XLNetBackbone.from_preset(str(tmp_path / "p"))
    ids, seg, pad = _inputs(batch=2)
    x = {"token_ids": ids, "segment_ids": seg, "padding_mask": pad}
    np.testing.assert_allclose(to_numpy(loaded(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)
    model_path = str(tmp_path / "m.keras")
    backbone.save(model_path)
    restored = keras.saving.load_model(model_path)
    np.testing.assert_allclose(to_numpy(restored(x)["sequence_output"]),
                               to_numpy(backbone(x)["sequence_output"]), atol=1e-6)


def _plm_batch(batch=4, length=16, num_predict=4, seed=0):
    import tensorflow as tf

    from keras_bertfam.preprocessing.permutation import PermutationMasker

    masker = PermutationMasker(length, num_predict=num_predict, reuse_len=length // 2,
                               seed=seed)
    ids = np.random.default_rng(seed).integers(10, 50, (batch, length)).astype("int32")
    out = {k: np.asarray(v) for k, v in masker(tf.constant(ids), seed=0).items()}
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids),
         "perm_mask": out["perm_mask"], "target_mapping": out["target_mapping"]}
    return x, out["target"], out["target_mask"]


@pytest.mark.multibackend
@pytest.mark.parametrize("memory", [False, True])
def test_plm_loss_falls_on_a_fixed_batch(memory):
    x, y, w = _plm_batch()
    backbone = XLNetBackbone(50, 2, 2, 16, 32, dropout=0.0, mem_len=8 if memory else None,
                             reuse_len=8 if memory else None)
    task = XLNetPretrainer(backbone, memory_batch_size=4 if memory else None)
    task.compile(learning_rate=1e-2)
    history = task.fit(x, y, sample_weight=w, batch_size=4, epochs=10, verbose=0)
    losses = history.history["plm_loss"]
    assert losses[-1] < 0.7 * losses[0]
    if memory:
        assert np.abs(task.memory.memory.numpy()).sum() > 0


@pytest.mark.multibackend
def test_memory_is_carried_between_consecutive_calls():
    x1, _, _ = _plm_batch(seed=1)
    x2, _, _ = _plm_batch(seed=2)
    backbone = XLNetBackbone(50, 2, 2, 16, 32, dropout=0.0, mem_len=8, reuse_len=8)
    task = XLNetPretrainer(backbone, memory_batch_size=4)
    conv = lambda d: {k: ops.convert_to_tensor(v) for k, v in d.items()}
    task(conv(x1))  # fills the memory from batch 1
    expected_mems = backbone.forward(
        conv(x1), mems=[ops.zeros((4, 8, 16))] * 2, return_mems=True)["mems"]
    for i in range(2):
        np.testing.assert_allclose(task.memory.memory.numpy()[i], to_numpy(expected_mems[i]),
                                   atol=1e-5)
    logits2 = to_numpy(task(conv(x2)))
    ref = backbone.forward(conv(x2), mems=expected_mems)["query_output"]
    ref_logits = to_numpy(task.lm_head(ref))
    np.testing.assert_allclose(logits2, ref_logits, atol=1e-4)
    task.reset_memory()
    assert np.abs(task.memory.memory.numpy()).sum() == 0



@pytest.mark.multibackend
def test_pretrainer_refuses_perm_mask_and_target_mapping_that_compute_silently_wrong():
    """`preprocessor=None`: HF's XLNetLMHeadModel blocks i -> j where `padding + perm_mask > 0`,
    ours where either is nonzero: a negative (or NaN) perm_mask attended in HF's and was blocked
    in ours. `target_mapping` rows pick each slot's position: a row with a value other than 0 / 1
    or two 1s mixed positions into one prediction, and a perm_mask or target_mapping of another
    batch size (or one position) broadcast. All ran silently; now a ValueError naming the input,
    the first wrong value and its position (or both shapes), on every backend, in memory, batch
    by batch from a generator and in a dataset's pipeline (which JAX and torch read unchecked).
    Positive perm_mask values (HF's `> 0`) and all-zero target_mapping rows (padding slots)
    still run."""
    import tensorflow as tf

    x, y, w = _plm_batch()
    task = XLNetPretrainer(XLNetBackbone(50, 1, 2, 16, 32, dropout=0.0), preprocessor=None)
    perm, mapping = x["perm_mask"], x["target_mapping"]
    negative, nan, two, second = perm.copy(), perm.copy(), mapping.copy(), mapping.copy()
    negative[1, 2, 3] = -1
    nan[0, 4, 5] = np.nan
    two[2, 1] *= 2
    column = int(np.argmax(mapping[3, 2]))
    second[3, 2, (column + 1) % 16] = 1
    first, after = sorted((column, (column + 1) % 16))
    perm_expected = (r"expected 0 \(i may attend to j\) or a positive value \(i may not: HF's "
                     r"XLNet reads perm_mask > 0 as 1\)")
    cases = [
        (dict(perm_mask=negative), r"perm_mask -1.0 at perm_mask\[1, 2, 3\]: " + perm_expected),
        (dict(perm_mask=nan), r"perm_mask nan at perm_mask\[0, 4, 5\]: " + perm_expected),
        (dict(target_mapping=two),
         rf"target_mapping 2.0 at target_mapping\[2, 1, {int(np.argmax(mapping[2, 1]))}\]: "
         r"expected 0 and 1 only"),
        (dict(target_mapping=second),
         rf"target_mapping 1.0 at target_mapping\[3, 2, {after}\] after a 1 at "
         rf"target_mapping\[3, 2, {first}\]: expected each row one-hot \(the position its "
         r"slot predicts\) or all 0 \(a padding slot\)"),
        (dict(perm_mask=perm[:1]), r"perm_mask of shape \(1, 16, 16\) for token_ids of shape "
                                   r"\(4, 16\): expected \(4, 16, 16\)"),
        (dict(perm_mask=perm[:, :1, :1]), r"perm_mask of shape \(4, 1, 1\)"),
        (dict(target_mapping=mapping[:1]), r"target_mapping of shape \(1, 4, 16\) for token_ids "
                                           r"of shape \(4, 16\): expected \(4, 4, 16\)"),
        (dict(target_mapping=mapping[:, :, :1]), r"target_mapping of shape \(4, 4, 1\)"),
    ]
    for i, (change, message) in enumerate(cases):
        bad = dict(x, **change)
        calls = [lambda: task.fit(bad, y, sample_weight=w, verbose=0),
                 lambda: task.predict(bad, verbose=0),
                 lambda: task.evaluate(bad, y, sample_weight=w, verbose=0),
                 lambda: task.train_on_batch(bad, y, sample_weight=w),
                 lambda: task.fit(((bad, y, w) for _ in range(1)), verbose=0)]
        if len(bad["perm_mask"]) == len(bad["target_mapping"]) == 4:  # (one dataset's rows)
            # a dataset's, as its batches are read (they ran silently on JAX and torch); fit
            # for the first case, predict (no train step traced) for the rest: the same map
            data = tf.data.Dataset.from_tensor_slices((bad, y, w)).batch(4)
            calls.append(lambda: (task.fit if i == 0 else task.predict)(data, verbose=0))
        for call in calls:
            with pytest.raises(ValueError, match="XLNetPretrainer got " + message):
                call()
    # HF reads perm_mask > 0 as 1, as ours does: the same predictions; padding slots run
    logits = to_numpy(task.predict_on_batch(x))
    for scale in (2.0, 0.5):
        np.testing.assert_allclose(to_numpy(task.predict_on_batch(dict(x, perm_mask=perm * scale))),
                                   logits, atol=1e-5)
    padded = mapping.copy()
    padded[:, -1] = 0
    w_padded = w.copy()
    w_padded[:, -1] = 0
    assert np.isfinite(task.fit(dict(x, target_mapping=padded), y, sample_weight=w_padded,
                                verbose=0).history["loss"]).all()


@pytest.mark.multibackend
def test_an_xlnet_model_is_built_without_a_keras_warning():
    """The query stream's mask embedding is not on the content-stream graph; left unbuilt until
    after the functional model, Keras warned "`build()` was called on layer 'xl_net_backbone'
    ... unbuilt state" at every XLNetBackbone a user made (and every task on one)."""
    import warnings

    from keras_bertfam.tasks.classifier import TextClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        backbone = XLNetBackbone(VOCAB, 1, 2, 16, 32)
        clf = TextClassifier(backbone, num_classes=2)
        XLNetPretrainer(XLNetBackbone(VOCAB, 1, 2, 16, 32))
        # Fine-tuning leaves the query stream's mask embedding without a gradient (as HF's
        # XLNetForSequenceClassification): Keras asked "did you forget to provide a `loss`?"
        x = {"token_ids": np.array([[5, 6, 4, 3]] * 2), "segment_ids": np.array([[0, 0, 0, 2]] * 2),
             "padding_mask": np.ones((2, 4), "int32")}
        before = to_numpy(backbone.mask_embedding.weights[0])
        clf.fit(x, np.array([0, 1]), epochs=1, verbose=0)
    assert backbone.mask_embedding.built and "mask_embedding/mask_emb" in [
        w.path for w in backbone.weights]
    if keras.backend.backend() != "jax":  # JAX's gradient is zeros: weight decay moves it
        np.testing.assert_array_equal(to_numpy(backbone.mask_embedding.weights[0]), before)
