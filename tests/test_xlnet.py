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
    assert XLNetBackbone(**small).num_params() == formula(small)
    assert XLNetBackbone(**base.config).num_params() == base.params


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
    task.compile(learning_rate=1e-2, jit_compile=False)
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


# === XLNetTokenizer ===


@pytest.fixture(scope="module")
def xlnet_spiece(tmp_path_factory):
    """A small XLNet-recipe SentencePiece model trained on the default corpus, in an HF-format
    directory (spiece.model)."""
    from keras_bertfam.preprocessing import corpus
    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    directory = tmp_path_factory.mktemp("xlnet_spm")
    train_xlnet_sentencepiece_model(corpus.default_corpus().take(800), 2000,
                                    output_file=str(directory / "spiece.model"))
    return directory


def _slow_xlnet_ids(sp, text):
    """HF's slow (SentencePiece-based) XLNetTokenizer, transcribed: preprocess_text (remove_space,
    keep_accents=False, do_lower_case=False) + _tokenize's digit-comma fix-up."""
    import unicodedata

    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    pieces = []
    for piece in sp.encode(text, out_type=str):
        if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
            cur = sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
            if piece[0] != "\u2581" and cur[0][0] == "\u2581":
                cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
            pieces += cur + [piece[-1]]
        else:
            pieces.append(piece)
    return [sp.piece_to_id(p) for p in pieces]


def _equal_up_to_ties(sp, ours, expected):
    """Equal ids, or an equally scored segmentation of the same pieces ("000" as "00" + "0" or
    "0" + "00"): Viterbi ties, which tf-text's and pip's SentencePiece builds break differently."""
    import collections

    if ours == expected:
        return True
    pieces = lambda ids: [sp.id_to_piece(i) for i in ids]
    score = lambda ids: sum(sp.get_score(i) for i in ids)
    return (collections.Counter(pieces(ours)) == collections.Counter(pieces(expected))
            and abs(score(ours) - score(expected)) < 1e-4)


def test_xlnet_tokenizer_ids_equal_slow_and_hf_xlnet_tokenizers(xlnet_spiece):
    import sentencepiece

    from keras_bertfam.preprocessing import corpus
    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    path = str(xlnet_spiece / "spiece.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    assert [sp.id_to_piece(i) for i in range(9)] == [
        "<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
    tok = XLNetTokenizer(path)
    assert (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id,
            tok.unk_token_id) == (3, 4, 5, 6, 0)
    assert (tok.bos_token_id, tok.eos_token_id, tok.eod_token_id, tok.eop_token_id) == (1, 2, 7, 8)
    assert tok.special_token_ids == list(range(9))
    docs = np.array(list(corpus.default_corpus().skip(20000).take(300).as_numpy_iterator()))
    sentences = [s.decode() for s in corpus.split_sentences(docs).flat_values.numpy()]
    sentences += ["Hello  world", "``quoted''", "Café NAÏVE 😀 ΣΑΣ", "tabs\tand\nnewlines ",
                  "1,000,000.5 in 1990, yes", "x\x85y\u3000z", "   ", ""]
    assert len(sentences) > 3000
    ours = tok(sentences).to_list()
    slow = [_slow_xlnet_ids(sp, s) for s in sentences]
    # Measured: 3,783 of 3,795 identical; the other 12 are equal-score segmentations.
    assert all(_equal_up_to_ties(sp, a, b) for a, b in zip(ours, slow))
    assert sum(a == b for a, b in zip(ours, slow)) >= 0.99 * len(sentences)
    # Cased: no lowercasing (HF's do_lower_case=False); accents dropped (keep_accents=False).
    assert [sp.id_to_piece(i) for i in tok(["Café"]).to_list()[0]] == [
        sp.id_to_piece(i) for i in sp.encode("Cafe")]
    hf = transformers.XLNetTokenizer.from_pretrained(str(xlnet_spiece))
    fast = [hf(s, add_special_tokens=False)["input_ids"] for s in sentences]
    assert all(_equal_up_to_ties(sp, a, b) for a, b in zip(ours, fast))
    assert sum(a == b for a, b in zip(ours, fast)) >= 0.99 * len(fast)  # measured 3,779
    # HF's special-token layout is xlnet_pack's: A <sep> B <sep> <cls>, left padding.
    from keras_bertfam.preprocessing.permutation import xlnet_pack

    a, b = "A short one.", "And a second, longer sentence."
    ref = hf(a, b, padding="max_length", max_length=24, return_token_type_ids=True)
    packed = xlnet_pack(tok([a]), tok([b]), 24, tok.sep_token_id, tok.cls_token_id,
                        tok.pad_token_id)
    assert packed["token_ids"].numpy()[0].tolist() == ref["input_ids"]
    assert packed["padding_mask"].numpy()[0].tolist() == ref["attention_mask"]
    real = np.array(ref["attention_mask"], bool)  # HF 5 pads segment ids with 0, HF 4 with 3
    np.testing.assert_array_equal(packed["segment_ids"].numpy()[0][real],
                                  np.array(ref["token_type_ids"])[real])


def test_xlnet_digit_comma_fix_up_on_a_cased_model():
    import io

    import sentencepiece

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    lines = [f"In {y}, the Year {y + 1}, came; A{y % 7}, b {y % 10}," for y in range(1900, 2000)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 5), model_writer=model, vocab_size=300,
        hard_vocab_limit=False, split_by_number=False,
        control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"], minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    assert [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
            if p[-1:] == "," and len(p) > 1 and p[-2].isdigit()]  # pieces such as "0,"
    tok = XLNetTokenizer(model.getvalue())
    texts = lines[:40] + ["In 1990, x1995, and 7,"]
    ours = tok(texts).to_list()
    assert ours == [_slow_xlnet_ids(sp, t) for t in texts]
    assert ours != [sp.encode(t) for t in texts]  # the fix-up changed something


def test_xlnet_tokenizer_from_hf_dir_preset_round_trip_and_offline_error(xlnet_spiece, tmp_path):
    import json

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    texts = ["An XLNet test, in 1990, with Accents: café."]
    direct = XLNetTokenizer(str(xlnet_spiece / "spiece.model"))
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "spiece.model").write_bytes((xlnet_spiece / "spiece.model").read_bytes())
    transformers.XLNetConfig(vocab_size=2000, d_model=16, n_layer=1, n_head=2,
                             d_inner=32).save_pretrained(str(hf_dir))
    from_hf = presets.load_tokenizer(str(hf_dir))  # no tokenizer_config.json: HF's defaults
    assert isinstance(from_hf, XLNetTokenizer) and not from_hf.lowercase
    assert from_hf(texts).to_list() == direct(texts).to_list()
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    lowered = presets.load_tokenizer(str(hf_dir))
    assert lowered.lowercase and lowered(["ABC"]).to_list() == direct(["abc"]).to_list()
    presets.save_backbone(XLNetBackbone(2000, 1, 2, 16, 32), str(tmp_path / "preset"),
                          tokenizer=direct)
    loaded = presets.load_tokenizer(str(tmp_path / "preset"))
    assert isinstance(loaded, XLNetTokenizer)
    assert loaded(texts).to_list() == direct(texts).to_list() == from_hf(texts).to_list()
    assert loaded.eod_token_id == 7 and loaded.cls_token_id == 3
    with pytest.raises(FileNotFoundError, match="spiece.model.*not installed offline"):
        presets.load_tokenizer("xlnet_base_en")
