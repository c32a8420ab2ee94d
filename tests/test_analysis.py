"""kb.analysis: attention maps and statistics, head importance (against HF's head_mask), structural
head pruning (equal to masking; presets; SavedModel export), the pruning loop, probes, the CLI.

Tiny random models (2-3 layers, hidden 16-32); HF references are random-init models saved to tmp.
"""
import os
import warnings

import keras
import numpy as np
import pytest

import keras_bertfam as kb
from conftest import python_runs, to_numpy
from keras_bertfam.preprocessing import finetuning as ft

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a film was great dull bad good movie story actor plot who wrote it ada , . ! ? "
    "##s ##ing ##ed"
).split()
TEXTS = ["the film was great!", "a dull plot, bad actor", "ada wrote it", "good story ."]
LABELS = [1, 0, 1, 1]


def tokenizer():
    return kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)


def bert(num_layers=3, num_heads=4, **kw):
    return kb.models.BertBackbone(len(VOCAB), num_layers, num_heads, 16, 32,
                                  max_sequence_length=32, dropout=0.0, **kw)


def inputs(batch=2, length=7, pad=2):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, len(VOCAB), (batch, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[-1, length - pad:] = 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def classifier(backbone=None, seq=16):
    return kb.tasks.TextClassifier(backbone or bert(), num_classes=2,
                                   preprocessor=ft.TextClassifierPreprocessor(tokenizer(), seq))


@pytest.fixture(scope="module")
def clf():
    """`classifier(bert(num_layers=2))` as a test's first build makes it (seed 1234: the same
    weights), once for the tests that only read it (analysis leaves a task as it was: head masks
    are restored, pruning makes a new task), so its preprocessor's traced call is shared too."""
    keras.utils.set_random_seed(1234)
    return classifier(bert(num_layers=2))


def masked(plan, counts):
    mask = np.ones((len(counts), max(counts)), "float32")
    for layer, heads in plan.items():
        mask[layer, heads] = 0.0
    return mask


# === Structural pruning ===
@pytest.mark.multibackend
def test_pruned_backbone_equals_masked_unpruned():
    """Rows/columns leave the kernels: fewer parameters (exactly 4 * (H*Hd + Hd) + Hd*H per head),
    per-layer head counts in the config, and the outputs of the unpruned model with those heads
    masked (<= 1e-5), which differ from the unmasked outputs."""
    b, x = bert(), inputs()
    plan = {0: [1, 3], 2: [0]}
    pruned = kb.analysis.prune_heads(b, plan)
    assert pruned.get_config()["heads_per_layer"] == [2, 4, 3]
    assert b.get_config().get("heads_per_layer") is None  # the original is untouched
    head_dim = 16 // 4
    per_head = 3 * (16 * head_dim + head_dim) + head_dim * 16
    assert b.num_params() - pruned.num_params() == 3 * per_head
    q = pruned.encoder.layer_block(0).attention.attention.query_dense.kernel
    assert tuple(q.shape) == (16, 2, head_dim)
    ref = to_numpy(b.inspect(x, head_mask=masked(plan, [4] * 3))["sequence_output"])
    got = to_numpy(pruned(x)["sequence_output"])
    assert np.abs(got - ref).max() <= 1e-5
    assert np.abs(to_numpy(b(x)["sequence_output"]) - ref).max() > 1e-3
    probs = pruned.inspect(x)["attention_probs"]
    assert [tuple(p.shape)[1] for p in probs] == [2, 4, 3]
    # pruning again numbers the remaining heads 0..n-1
    again = kb.analysis.prune_heads(pruned, {0: [0]})
    ref2 = to_numpy(b.inspect(x, head_mask=masked({0: [0, 1, 3], 2: [0]}, [4] * 3))[
        "sequence_output"])
    assert np.abs(to_numpy(again(x)["sequence_output"]) - ref2).max() <= 1e-5


@pytest.mark.multibackend
@pytest.mark.parametrize("family", ["albert", "distil_bert", "electra", "roberta"])
def test_prune_every_encoder_family(family):
    kw = dict(vocabulary_size=len(VOCAB), num_layers=2, num_heads=4, hidden_dim=16,
              intermediate_dim=32, max_sequence_length=32)
    cls = {"albert": kb.models.AlbertBackbone, "distil_bert": kb.models.DistilBertBackbone,
           "electra": kb.models.ElectraBackbone, "roberta": kb.models.RobertaBackbone}[family]
    if family == "albert":
        kw.update(embedding_dim=8, num_groups=2)  # no sharing across the two layers
    b = cls(**kw)
    x = inputs()
    if family == "distil_bert":
        x.pop("segment_ids")
    pruned = kb.analysis.prune_heads(b, {1: [0, 2]})
    ref = to_numpy(b.inspect(x, head_mask=masked({1: [0, 2]}, [4, 4]))["sequence_output"])
    assert np.abs(to_numpy(pruned(x)["sequence_output"]) - ref).max() <= 1e-5


def test_albert_shared_layers_prune_together():
    b = kb.models.AlbertBackbone(len(VOCAB), 4, 4, 8, 16, 32,
                                 max_sequence_length=32)
    with pytest.warns(UserWarning, match=r"Layers \[0, 1, 2, 3\].*share one attention") as caught:
        pruned = kb.analysis.prune_heads(b, {1: [2]})
    assert [w.filename for w in caught] == [__file__]  # the user's prune_heads line
    assert pruned.get_config()["heads_per_layer"] == [3, 3, 3, 3]
    x = inputs()
    ref = to_numpy(b.inspect(x, head_mask=masked({i: [2] for i in range(4)}, [4] * 4))[
        "sequence_output"])
    assert np.abs(to_numpy(pruned(x)["sequence_output"]) - ref).max() <= 1e-5
    assert b.num_params() > pruned.num_params()


def test_prune_heads_bad_input():
    b = bert()
    with pytest.raises(ValueError, match=r"Head 4 of layer 1 is out of range: the layer has 4"):
        kb.analysis.prune_heads(b, {1: [4]})
    with pytest.raises(ValueError, match=r"Layer 3 is out of range: the model has 3 layers"):
        kb.analysis.prune_heads(b, {3: [0]})
    with pytest.raises(ValueError, match=r"every head of layer 0.*allow_empty_layers=True"):
        kb.analysis.prune_heads(b, {0: [0, 1, 2, 3]})
    with pytest.raises(TypeError, match="dict"):
        kb.analysis.prune_heads(b, [0, 1])
    xl = kb.models.XLNetBackbone(len(VOCAB), 2, 2, 16, 32)
    with pytest.raises(ValueError, match=r"'xlnet' family \(XLNetBackbone\) does not take"):
        kb.analysis.prune_heads(xl, {0: [0]})
    # with the flag, an empty layer is its output bias (a residual pass-through of attention)
    empty = kb.analysis.prune_heads(b, {0: [0, 1, 2, 3]}, allow_empty_layers=True)
    x = inputs()
    ref = to_numpy(b.inspect(x, head_mask=masked({0: [0, 1, 2, 3]}, [4] * 3))["sequence_output"])
    assert np.abs(to_numpy(empty(x)["sequence_output"]) - ref).max() <= 1e-5


def test_pruned_task_saves_reloads_and_exports(tmp_path):
    """A pruned classifier: save_to_preset -> from_preset (same logits), SavedModel export on raw
    strings passes the TF Serving op audit and gives the in-process logits."""
    import tensorflow as tf

    clf = classifier()
    pruned = kb.analysis.prune_heads(clf, {0: [0, 1], 1: [3], 2: [1, 2]})
    assert isinstance(pruned, kb.tasks.TextClassifier)
    np.testing.assert_allclose(to_numpy(pruned.head.kernel), to_numpy(clf.head.kernel))
    expected = pruned.predict(TEXTS, verbose=0)
    mask = masked({0: [0, 1], 1: [3], 2: [1, 2]}, [4] * 3)
    with kb.analysis._common.head_mask_override(clf.backbone, keras.ops.convert_to_tensor(mask)):
        masked_logits = clf.predict(TEXTS, verbose=0)
    assert np.abs(expected - masked_logits).max() <= 1e-5

    pruned.save_to_preset(str(tmp_path / "preset"))
    again = kb.tasks.TextClassifier.from_preset(str(tmp_path / "preset"))
    assert again.backbone.get_config()["heads_per_layer"] == [2, 3, 2]
    np.testing.assert_allclose(again.predict(TEXTS, verbose=0), expected, atol=1e-6)

    out = str(tmp_path / "export" / "1")
    kb.export.export_saved_model(pruned, out)
    assert not kb.export.audit_ops(out)["unsupported"]
    got = tf.saved_model.load(out).signatures["serving_default"](text=tf.constant(TEXTS))
    np.testing.assert_allclose(got["logits"].numpy(), expected, atol=1e-5)


# === Head importance ===
def _converted_classifier(hf, tmp_path):
    """An HF `*ForSequenceClassification` (its head and biases drawn N(0, 0.5) from torch's
    current seed, so that they matter), saved and loaded as our TextClassifier."""
    import torch

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "classifier" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(str(tmp_path / "hf"))
    return kb.tasks.TextClassifier.from_preset(str(tmp_path / "hf"), num_classes=2,
                                               preprocessor=None)


@pytest.mark.multibackend
def test_head_importance_matches_hf_head_mask(tmp_path):
    """Michel et al.'s scores on a converted HF BertForSequenceClassification equal the gradients
    of HF's loss with respect to a head mask of ones (|d loss / d mask| summed over batches,
    per-layer L2 normalized, as HF's bertology script) to <= 1e-4 relative; the accuracy drop
    equals masking one head. transformers 5 dropped the `head_mask` argument, so the mask is
    applied by a hook scaling each head's context before the attention output projection, which
    is what multiplying its probabilities does (the context is linear in them)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(config).eval()
    clf = _converted_classifier(hf, tmp_path)
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(2):
        x = inputs(batch=3, length=8, pad=3)
        x["token_ids"] = rng.integers(5, len(VOCAB), (3, 8)).astype("int32")
        batches.append((x, rng.integers(0, 2, (3,)).astype("int32")))

    def hf_gradients(start):  # HF: the gradient of its loss with respect to a head_mask
        hf_raw = np.zeros((2, 4))
        for x, y in batches:
            head_mask = torch.tensor(start, requires_grad=True)

            def hook(i, head_mask=head_mask):
                def scale(module, args):
                    (context,) = args  # (B, T, N * Hd)
                    b, t, _ = context.shape
                    return (context.view(b, t, 4, -1) * head_mask[i][None, None, :, None]
                            ).view(b, t, -1),
                return scale

            handles = [layer.attention.output.dense.register_forward_pre_hook(hook(i))
                       for i, layer in enumerate(hf.bert.encoder.layer)]
            out = hf(input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(x["padding_mask"]),
                     token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
                     labels=torch.tensor(y, dtype=torch.long))
            out.loss.backward()
            for handle in handles:
                handle.remove()
            hf_raw += head_mask.grad.abs().numpy()
        return hf_raw, hf_raw / np.sqrt((hf_raw ** 2).sum(-1, keepdims=True))

    hf_raw, hf_norm = hf_gradients(np.ones((2, 4), "float32"))

    import tensorflow as tf

    def gen():
        yield from batches

    spec = ({k: tf.TensorSpec((None, 8), tf.int32) for k in batches[0][0]},
            tf.TensorSpec((None,), tf.int32))
    data = tf.data.Dataset.from_generator(gen, output_signature=spec)
    result = kb.analysis.head_importance(clf, data)
    assert np.abs(result.raw - hf_raw).max() <= 1e-4 * np.abs(hf_raw).max()
    assert np.abs(result.importance - hf_norm).max() <= 1e-4
    assert result.metric == "accuracy"
    # the drop of head (1, 2) is the accuracy with only it masked
    only = np.ones((2, 4), "float32")
    only[1, 2] = 0
    acc = kb.analysis.evaluate_with_mask(clf, data, only)
    assert result.accuracy_drop[1, 2] == pytest.approx(result.baseline - acc)
    assert result.accuracy_drop.shape == (2, 4) and np.isfinite(result.accuracy_drop).all()

    # From a mask (HF's compute_heads_importance(head_mask=...), as its mask_heads loop calls
    # it): a masked head's gradient is HF's in `raw`, and in the per-layer norm of the heads
    # left, whose scores are HF's; its own score is NaN (HF's mask_heads sets it to inf before
    # choosing): not a head of the model, never ranked as the least important. Its score was
    # finite, e.g. the second lowest, the next one a ranking of `importance` would mask again.
    start = np.ones((2, 4), "float32")
    start[0, 1] = start[1, 3] = 0
    hf_raw, hf_norm = hf_gradients(start)
    result = kb.analysis.head_importance(clf, data, mask=start, accuracy_drop=False)
    assert np.abs(result.raw - hf_raw).max() <= 1e-4 * np.abs(hf_raw).max()
    assert np.isnan(result.importance[start == 0]).all()
    assert np.abs(result.importance - hf_norm)[start == 1].max() <= 1e-4
    masked = kb.analysis.head_importance(clf, data, mask=start, accuracy_drop=True,
                                         normalize_global=True)
    assert np.isnan(masked.importance[start == 0]).all()
    assert np.isnan(masked.accuracy_drop[start == 0]).all()
    kept = kb.analysis.normalize_importance(hf_raw, normalize_global=True)[start == 1]
    np.testing.assert_allclose(masked.importance[start == 1], kept, atol=1e-4)


def test_head_importance_on_raw_strings_and_bad_input(clf):
    result = kb.analysis.head_importance(clf, (TEXTS, LABELS), accuracy_drop=False)
    assert result.importance.shape == (2, 4) and result.accuracy_drop is None
    np.testing.assert_allclose(np.sqrt((result.importance ** 2).sum(-1)), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="needs labels"):
        kb.analysis.head_importance(clf, __import__("tensorflow").data.Dataset.from_tensor_slices(
            TEXTS).batch(2))
    with pytest.raises(TypeError, match="task or a kb.models backbone"):
        kb.analysis.head_importance("clf", (TEXTS, LABELS))


def test_iterative_pruning_curve(tmp_path, clf):
    curve = kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=0.5, step=0.25)
    assert [r["heads_pruned"] for r in curve.rows] == [0, 2, 4]
    for before, after in zip(curve.masks, curve.masks[1:]):  # a masked head is never re-chosen
        assert (after[before == 0] == 0).all() and (after == 0).sum() == (before == 0).sum() + 2
    plan = curve.plan()
    assert sum(len(h) for h in plan.values()) == 4
    assert all(len(h) < 4 for h in plan.values())  # no layer emptied
    table, png = curve.write(str(tmp_path))
    assert open(table).read().startswith("step,heads_pruned,fraction_pruned,accuracy")
    assert os.path.getsize(png) > 1000
    # the last row's accuracy is that of the structurally pruned model
    pruned = kb.analysis.prune_heads(clf, plan)
    acc = float(np.mean(np.argmax(pruned.predict(TEXTS, verbose=0), -1) == np.array(LABELS)))
    assert acc == pytest.approx(curve.rows[-1]["accuracy"])
    with pytest.raises(ValueError, match="target"):
        kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=1.5)


# === Attention maps ===
def test_attention_maps_statistics_and_plots(tmp_path, clf):
    maps = kb.analysis.attention_maps(clf, TEXTS[:2])
    assert maps.tokens[0] == ["[CLS]", "the", "film", "was", "great", "!", "[SEP]"]
    assert maps.maps[0][1].shape == (4, 7, 7)
    np.testing.assert_allclose(maps.maps[0][0].sum(-1), 1.0, rtol=1e-5)
    # the same numbers as the backbone's own attention on the packed ids
    ids = np.array([[2] + [VOCAB.index(t) for t in maps.tokens[0][1:-1]] + [3]], "int32")
    ref = clf.backbone.inspect({"token_ids": ids, "segment_ids": np.zeros_like(ids),
                                "padding_mask": np.ones_like(ids)})["attention_probs"][1]
    np.testing.assert_allclose(maps.maps[0][1], to_numpy(ref)[0], atol=1e-6)
    stats = maps.statistics()
    p = maps.maps[0][0][2]  # layer 0 head 2 of text 0: check to_cls and to_previous by hand
    q = maps.maps[1][0][2]
    expected_cls = (p[:, 0].sum() + q[:, 0].sum()) / (p.shape[0] + q.shape[0])
    expected_prev = (np.diag(p, -1).sum() + np.diag(q, -1).sum()) / (p.shape[0] + q.shape[0] - 2)
    assert stats["to_cls"][0, 2] == pytest.approx(expected_cls, rel=1e-5)
    assert stats["to_previous"][0, 2] == pytest.approx(expected_prev, rel=1e-5)
    punct = np.array([t in ("!", ",") for t in maps.tokens[1]])
    assert stats["to_punctuation"][1, 0] > 0 and punct.sum() == 1
    assert np.all(stats["entropy"] <= np.log(9) + 1e-6)

    grid = kb.analysis.plot_attention(maps, str(tmp_path / "grid.png"))
    single = kb.analysis.plot_attention(maps, str(tmp_path / "one.png"), layer=1, head=3)
    assert os.path.getsize(grid) > 1000 and os.path.getsize(single) > 1000
    with pytest.raises(ValueError, match="head 4 is out of range: layer 1 has 4 heads"):
        kb.analysis.plot_attention(maps, str(tmp_path / "x.png"), layer=1, head=4)


def test_attention_maps_truncate_long_texts_with_a_warning():
    b = kb.models.BertBackbone(len(VOCAB), 1, 2, 16, 32, max_sequence_length=8)
    long_text = " ".join(["film"] * 20)
    with pytest.warns(UserWarning, match=r"1 of 2 texts were longer than 8 tokens"):
        maps = kb.analysis.attention_maps(b, [long_text, "ada"], tokenizer=tokenizer())
    assert len(maps.tokens[0]) == 8 and maps.tokens[0][-1] == "[SEP]"
    with pytest.raises(ValueError, match="needs a tokenizer"):
        kb.analysis.attention_maps(b, ["ada"])


def test_attention_maps_of_xlnet_and_pruned_models():
    sp = pytest.importorskip("sentencepiece")  # noqa: F841
    xl = kb.models.XLNetBackbone(len(VOCAB), 2, 2, 16, 32)
    maps = kb.analysis.attention_maps(xl, ["the film"], tokenizer=tokenizer())
    assert maps.tokens[0][-2:] == ["[SEP]", "[CLS]"]  # XLNet's layout: text <sep> <cls>
    assert maps.maps[0][0].shape[0] == 2
    pruned = kb.analysis.prune_heads(bert(num_layers=2), {0: [1]})
    stats = kb.analysis.attention_maps(pruned, TEXTS, tokenizer=tokenizer()).statistics()
    assert np.isnan(stats["entropy"][0, 3]) and np.isfinite(stats["entropy"][1, 3])


# === Probes ===
def _copy_task(n=96, length=10, seed=0):
    """A property the embeddings carry: is the token the word "film" (token level); does the
    sentence contain "film" (sentence level)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, len(VOCAB), (n, length)).astype("int32")
    ids[:, 0], ids[:, -1] = 2, 3
    film = VOCAB.index("film")
    has = rng.random(n) < 0.5
    for i in range(n):
        ids[i, 1:-1][ids[i, 1:-1] == film] = VOCAB.index("plot")
        if has[i]:
            ids[i, rng.integers(1, length - 1)] = film
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": np.ones_like(ids)}
    token_labels = (ids == film).astype("int64")
    token_labels[:, 0] = token_labels[:, -1] = -1
    return features, token_labels, has.astype("int64")


def test_probe_token_and_sentence_level(tmp_path, monkeypatch):
    """Probes of the layers, token and sentence level. The layers of one width share one probe
    model (a new one per layer traced its train and test steps again: ~1.2 s a layer on 2
    cores), each layer starting from the same initial weights and a fresh optimizer, as a new
    model would."""
    probing = kb.analysis.probing
    starts = []
    original = probing._fit

    def recording(model, *args):
        optimizer = getattr(model, "optimizer", None)
        starts.append((model, model.get_weights(), None if optimizer is None or not
                       optimizer.built else [to_numpy(v) for v in optimizer.variables]))
        return original(model, *args)

    monkeypatch.setattr(probing, "_fit", recording)
    keras.utils.set_random_seed(0)  # the backbone's weights (the probe is seeded): seeds 0-7 pass
    b = bert(num_layers=2)
    features, token_labels, sentence_labels = _copy_task()
    tok = kb.analysis.probe(b, (features, token_labels), epochs=20)
    assert tok.layers == [0, 1, 2] and len(tok.scores) == 3
    assert len(starts) == 3 and len({id(model) for model, _, _ in starts}) == 1  # one model
    (_, first, _), *later = starts
    for layer, (model, weights, state) in zip((1, 2), later):
        for got, expected in zip(weights, first):
            np.testing.assert_array_equal(got, expected, err_msg=f"layer {layer}")
        # the optimizer as built: no step taken, zero moments, the learning rate given
        for variable, value in zip(model.optimizer.variables, state):
            expected = 1e-2 if variable.path.endswith("learning_rate") else 0
            np.testing.assert_allclose(value, expected, err_msg=f"layer {layer}: {variable.path}")
    assert tok.scores[0] >= 0.97 > tok.majority - 0.2  # the identity is in the embeddings
    sent = kb.analysis.probe(b, (features, sentence_labels), layers=[0, 2], kind="mlp",
                             epochs=40)
    assert sent.layers == [0, 2] and all(0.0 <= s <= 1.0 for s in sent.scores)
    png = kb.analysis.plot_probe({"bert": tok}, str(tmp_path / "probe.png"))
    assert os.path.getsize(png) > 1000
    with pytest.raises(ValueError, match=r"Layer 3 is out of range: representations 0"):
        kb.analysis.probe(b, (features, token_labels), layers=[3])
    with pytest.raises(ValueError, match="labels must be"):
        kb.analysis.probe(b, (features, token_labels[:5]))
    with pytest.raises(ValueError, match="kind must be"):
        kb.analysis.probe(b, (features, sentence_labels), kind="svm", layers=[0])


def _span_pair_task(n=160, length=8):
    """Label: do the two one-token spans hold the same token? `(features, spans1, spans2,
    labels)`, spans [start, end) of one token (and the start positions s1, s2)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 9, (n, length)).astype("int32")
    s1 = rng.integers(1, 4, n)
    s2 = rng.integers(4, 7, n)
    same = rng.random(n) < 0.5
    ids[same, s2[same]] = ids[same, s1[same]]
    labels = (ids[np.arange(n), s1] == ids[np.arange(n), s2]).astype("int64")
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": np.ones_like(ids)}
    return (features, np.stack([s1, s1 + 1], 1), np.stack([s2, s2 + 1], 1), labels), (s1, s2)


def test_edge_probe_learns_a_span_pair_relation():
    """The span pair relation is readable from the embeddings through self-attentive pooling of
    each span."""
    b = bert(num_layers=1)
    data, (s1, s2) = _span_pair_task()
    features, spans1, spans2, labels = data
    result = kb.analysis.edge_probe(b, data, layers=[0], epochs=60)
    assert result.scores[0] >= 0.8 > result.majority
    with pytest.raises(ValueError, match=r"spans2 must hold non-empty"):
        kb.analysis.edge_probe(b, (features, spans1, np.stack([s2, s2], 1), labels))
    with pytest.raises(ValueError, match=r"spans1 must hold integer token positions, got "
                                         r"dtype float64 \(e\.g\. \[\d\.5, \d\.5\]\)"):
        kb.analysis.edge_probe(b, (features, spans1 + 0.5, spans2, labels))


@pytest.mark.multibackend  # (on JAX and torch Keras opens an extra iterator in a first fit)
def test_edge_probe_layers_share_one_model_that_trains_as_a_new_one(monkeypatch):
    """edge_probe built and compiled a new model for every layer (its train and test steps
    traced again each time) whose unseeded layers started from other weights each time. Now
    the layers of one width share one model, traced once for all, every layer from the same
    seeded weights and a fresh optimizer: its scores and trained weights are those of a new
    model built for each layer."""
    probing = kb.analysis.probing
    original_fit, original_fresh = probing._fit, probing._fresh_model
    b = bert(num_layers=2)
    data, _ = _span_pair_task(n=32)

    def run(fresh_model):
        monkeypatch.setattr(probing, "_fresh_model", fresh_model)
        fits, traces = [], {}  # traces: train_step's Python runs (TF, JAX: traces), by model

        def recording(model, *args):
            if id(model) not in traces:
                step, traces[id(model)] = model.train_step, []
                model.train_step = lambda *a: traces[id(model)].append(1) or step(*a)
            start = model.get_weights()
            scores = original_fit(model, *args)
            fits.append((model, start, model.get_weights()))
            return scores

        monkeypatch.setattr(probing, "_fit", recording)
        keras.utils.set_random_seed(0)  # tf.data's shuffles: the same in both runs
        # two layers of one width (the embeddings and the last): the second fit of the shared
        # model starts from what the first left, the point of the reset
        result = kb.analysis.edge_probe(b, data, layers=[0, 2], epochs=2, batch_size=8)
        return result, fits, [len(t) for t in traces.values()]

    shared, shared_fits, shared_traces = run(original_fresh)
    # the reference: a new model for every layer (a `models` cache of its own each time)
    new, new_fits, new_traces = run(lambda models, *args: original_fresh({}, *args))
    # one model for the 2 layers, its step traced once, as a new model's is, not again for
    # each layer (its compiled metrics are built before its first fit: on TF, Keras made them
    # in the first trace, and traced the step twice)
    assert len(shared_fits) == 2 and len(new_traces) == 2, (shared_traces, new_traces)
    if keras.backend.backend() != "torch":  # (torch runs the step eagerly: nothing traced)
        assert shared_traces == [1] and new_traces == [1, 1], (shared_traces, new_traces)
    assert shared.scores == new.scores and shared.train_scores == new.train_scores
    for layer, ((_, start, end), (_, new_start, new_end)) in enumerate(zip(shared_fits,
                                                                           new_fits)):
        for got, expected in zip(start + end, new_start + new_end):
            np.testing.assert_array_equal(got, expected, err_msg=f"layer {layer}")
        for got, expected in zip(start, shared_fits[0][1]):  # one seeded start for all
            np.testing.assert_array_equal(got, expected, err_msg=f"layer {layer}")


def test_probes_repeat_their_training_given_the_same_seed(monkeypatch):
    """A probe's examples are shuffled with its `seed`: they took tf.data's global seed, so a
    second call in the same process trained on another order, to other weights and scores."""
    probing = kb.analysis.probing
    original = probing._fit
    trained = []

    def recording(model, *args):
        scores = original(model, *args)
        trained.append(model.get_weights())
        return scores

    monkeypatch.setattr(probing, "_fit", recording)
    b = bert(num_layers=1)
    features, _, sentence_labels = _copy_task(n=24)
    pairs, _ = _span_pair_task(n=24)
    for _ in range(2):
        kb.analysis.probe(b, (features, sentence_labels), layers=[1], epochs=2, batch_size=4)
        kb.analysis.edge_probe(b, pairs, layers=[1], epochs=2, batch_size=4)
    assert len(trained) == 4
    for got, expected in zip(trained[2] + trained[3], trained[0] + trained[1]):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.multibackend
def test_span_pool_is_attention_over_the_span():
    pool = kb.analysis.SelfAttentiveSpanPool()
    states = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
    span = np.array([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1]], "float32")
    out = to_numpy(pool([states, span]))
    w = to_numpy(pool.score.kernel)[:, 0]
    b = to_numpy(pool.score.bias)[0]
    logits = states[0, 1:3] @ w + b
    a = np.exp(logits - logits.max())
    a /= a.sum()
    np.testing.assert_allclose(out[0], a @ states[0, 1:3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], states[1, 4], rtol=1e-5, atol=1e-6)
    seeded = kb.analysis.SelfAttentiveSpanPool(keras.initializers.GlorotUniform(3))
    config = seeded.get_config()
    assert config["kernel_initializer"]["config"]["seed"] == 3
    assert kb.analysis.SelfAttentiveSpanPool.from_config(config).get_config() == config


# === CLI ===
def test_cli_analyze_writes_maps_statistics_and_importance(tmp_path, capsys, clf):
    from keras_bertfam import cli

    clf.save_to_preset(str(tmp_path / "preset"))
    texts = tmp_path / "texts.tsv"
    texts.write_text("".join(f"{t}\t{y}\n" for t, y in zip(TEXTS, LABELS)), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["analyze", "--task", str(tmp_path / "preset"), "--texts", str(texts),
                     "--output", str(out), "--accuracy-drop", "--head", "1,2"]) == 0
    files = set(os.listdir(out))
    for name in ("attention_maps.npz", "tokens.json", "attention_text0.png",
                 "attention_text0_L1_H2.png", "head_statistics.csv", "stat_entropy.png",
                 "head_importance.csv", "head_importance.png", "accuracy_drop.png",
                 "summary.json"):
        assert name in files, name
    rows = open(out / "head_importance.csv").read().splitlines()
    assert rows[0] == "layer,head,importance,raw_importance,accuracy_drop" and len(rows) == 9
    assert len(np.load(out / "attention_maps.npz").files) == 2 * len(TEXTS)
    assert "text" in capsys.readouterr().out  # the progress bar
    assert cli.main(["analyze", "--task", str(tmp_path / "preset"), "--texts",
                     str(tmp_path / "none.txt"), "--output", str(out)]) == 1
    assert f"--texts {tmp_path / 'none.txt'} is not a file" in capsys.readouterr().err


def test_probe_reads_one_iterator_per_probe(monkeypatch):
    """A probe trains from one iterator over its repeated, reshuffled examples (Keras opens one
    per epoch given arrays)."""
    import tensorflow as tf

    backbone = kb.models.BertBackbone(30, 2, 2, 16, 32, max_sequence_length=16)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 30, (24, 8)).astype("int32")
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": np.ones_like(ids)}
    labels = (ids[:, 1] > 17).astype("int64")
    opened = []
    original = tf.data.Dataset.__iter__
    monkeypatch.setattr(tf.data.Dataset, "__iter__",
                        lambda self: opened.append(self) or original(self))
    result = kb.analysis.probe(backbone, (features, labels), layers=[0, 2], epochs=10,
                               batch_size=8)
    assert result.layers == [0, 2] and len(result.scores) == 2
    assert all(0.0 <= s <= 1.0 for s in result.scores + result.train_scores)
    # per probe: one for its 10 epochs (18 training examples: 3 batches each) and those of its
    # two evaluations (Keras opens 2 per evaluation of arrays); it was 24 per probe
    assert len(opened) <= 2 * 5, len(opened)


# === Sweep fixes ===
@pytest.mark.multibackend
def test_albert_inner_repetitions_one_state_and_map_per_layer():
    """num_inner_repetitions=2: inspect returns one hidden state / attention map per LAYER (the
    layer's output after its last inner block; the last inner block's map); prune_heads prunes
    every inner block of a layer."""
    b = kb.models.AlbertBackbone(len(VOCAB), 2, 4, 8, 16, 32, max_sequence_length=32,
                                 num_inner_repetitions=2)
    x = inputs()
    out = b.inspect(x)
    assert len(out["hidden_states"]) == 3 and len(out["attention_probs"]) == 2
    np.testing.assert_allclose(to_numpy(out["hidden_states"][-1]),
                               to_numpy(out["sequence_output"]), atol=1e-6)
    reps = kb.analysis.representations(b, x)
    np.testing.assert_allclose(reps[2], to_numpy(out["sequence_output"]), atol=1e-6)
    with pytest.warns(UserWarning, match="share one attention"):
        pruned = kb.analysis.prune_heads(b, {0: [1]})
    ref = to_numpy(b.inspect(x, head_mask=masked({0: [1], 1: [1]}, [4, 4]))["sequence_output"])
    assert np.abs(to_numpy(pruned(x)["sequence_output"]) - ref).max() <= 1e-5


def test_masked_metric_weights_batches_by_the_metric_denominator():
    """evaluate_with_mask / head_importance's baseline: the metric over the whole dataset (sample
    weights; a token classifier's real tokens), whatever the batch size."""
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    clf = classifier(bert(num_layers=1))
    pred = np.argmax(clf.predict(TEXTS, verbose=0), -1)
    sw = np.array([1.0, 0.0, 0.0, 0.0], "float32")
    expected = float(pred[0] == LABELS[0])
    ds = tf.data.Dataset.from_tensor_slices((TEXTS, LABELS, sw)).batch(2)
    assert kb.analysis.evaluate_with_mask(clf, ds) == pytest.approx(expected)
    assert kb.analysis.head_importance(clf, ds, accuracy_drop=False).baseline == pytest.approx(
        expected)
    tc = kb.tasks.TokenClassifier(bert(num_layers=1), num_classes=3, preprocessor=None)
    x = inputs(batch=4, length=8, pad=0)
    x["padding_mask"][2:, 2:] = 0
    y = np.random.default_rng(0).integers(0, 3, (4, 8)).astype("int32")
    w = x["padding_mask"].astype("float32")
    pred = np.argmax(to_numpy(tc(x)), -1)
    expected = float(((pred == y) * w).sum() / w.sum())
    for size in (2, 4):
        data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(size)
        assert kb.analysis.evaluate_with_mask(tc, data) == pytest.approx(expected, abs=1e-6)


def test_head_importance_of_a_masked_lm_reports_its_accuracy():
    """A MaskedLM: the accuracy-like `mlm_accuracy`, not `mlm_loss`; with only a loss (a
    regression classifier's mse), the drop is the loss's increase, named so."""
    mlm = kb.tasks.MaskedLM(bert(num_layers=1), preprocessor=None)
    x = inputs(batch=4)
    y = np.full((4, 2), 7, "int32")
    data = ({**x, "mask_positions": np.tile(np.array([[1, 2]], "int32"), (4, 1))}, y)
    r = kb.analysis.head_importance(mlm, data)
    assert r.metric == "mlm_accuracy" and not r.lower_is_better
    assert r.drop_name == "mlm_accuracy_drop"
    reg = kb.tasks.TextClassifier(bert(num_layers=1), num_classes=1, preprocessor=None)
    r = kb.analysis.head_importance(reg, (x, np.array([0.5, 1.0, -1.0, 2.0], "float32")))
    assert r.metric == "mse" and r.lower_is_better and r.drop_name == "mse_increase"
    base = r.baseline
    worse = kb.analysis.evaluate_with_mask(reg, (x, np.array([0.5, 1.0, -1.0, 2.0], "float32")),
                                           mask=masked({0: [1]}, [4]))
    assert r.accuracy_drop[0, 1] == pytest.approx(worse - base, rel=1e-4, abs=1e-6)


def test_iterative_pruning_of_albert_masks_shared_heads_together():
    """ALBERT's layers share one attention: the curve masks a head in every layer sharing it,
    counts distinct heads, and its plan builds the model it measured (no union warning)."""
    b = kb.models.AlbertBackbone(len(VOCAB), 3, 4, 8, 16, 32, max_sequence_length=32)
    clf = classifier(b)
    curve = kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=0.5, step=0.25)
    assert [r["heads_pruned"] for r in curve.rows] == [0, 1, 2]
    plan = curve.plan()
    assert sorted(plan) == [0, 1, 2] and plan[0] == plan[1] == plan[2] and len(plan[0]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruned = kb.analysis.prune_heads(clf, plan)
    with kb.analysis._common.head_mask_override(clf.backbone, keras.ops.convert_to_tensor(
            curve.masks[-1])):
        ref = clf.predict(TEXTS, verbose=0)
    assert np.abs(pruned.predict(TEXTS, verbose=0) - ref).max() <= 1e-5


def test_probe_first_pooling_takes_the_first_real_token(monkeypatch):
    """XLNet left-pads: pooling="first" takes each row's first real token, not a padding one."""
    b = kb.models.XLNetBackbone(len(VOCAB), 1, 2, 16, 32)
    ids = np.random.default_rng(0).integers(5, len(VOCAB), (8, 6)).astype("int32")
    mask = np.ones_like(ids)
    mask[::2, :3] = 0  # left padding
    ids[mask == 0] = 0
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    labels = np.arange(8) % 2
    seen = []
    monkeypatch.setattr(kb.analysis.probing, "_fit",
                        lambda model, train, val, *a: seen.append(train[0]) or (1.0, 1.0))
    kb.analysis.probe(b, (features, labels), layers=[0], pooling="first")
    rows, _ = kb.analysis.probing._split(8, 0.25, 0)
    reps = kb.analysis.representations(b, features, [0])[0]
    pooled = reps[rows, mask[rows].argmax(1)]
    expected = (pooled - pooled.mean(0)) / (pooled.std(0) + 1e-6)
    np.testing.assert_allclose(seen[0], expected, atol=1e-4)


def test_export_to_transformers_refuses_a_pruned_model(tmp_path):
    pruned = kb.analysis.prune_heads(bert(num_layers=2), {1: [0, 2]})
    with pytest.raises(ValueError, match=r"pruned.*layer 1 \(2 of 4 heads\)"):
        kb.presets.export_to_transformers(pruned, str(tmp_path / "hf"))
    assert not os.path.exists(tmp_path / "hf")


def test_plots_return_the_file_they_write(tmp_path):
    values = np.ones((2, 2))
    got = kb.analysis.plot_heads(values, str(tmp_path / "heads"))
    assert got == str(tmp_path / "heads.png") and os.path.isfile(got)
    with pytest.raises(ValueError, match="path"):
        kb.analysis.plot_heads(values, "")


def test_analyses_of_one_task_trace_its_masked_forward_pass_once(monkeypatch):
    """head_importance (its baseline and accuracy drops), evaluate_with_mask and
    iterative_pruning on the same task and data run one traced forward pass with the head mask
    as its argument: on TensorFlow `metric_weights` (called only there) runs once, when it is
    traced. Each call traced it anew before (3 runs here)."""
    clf = classifier(bert(num_layers=1, num_heads=2))
    runs = python_runs(monkeypatch, (type(clf), "metric_weights"))
    kb.analysis.head_importance(clf, (TEXTS, LABELS))
    assert 0 <= kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), [[1, 0]]) <= 1
    curve = kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=0.5, step=0.5)
    assert [r["heads_pruned"] for r in curve.rows] == [0, 1]
    assert runs == {"TextClassifier.metric_weights": 1}


def test_evaluate_with_mask_checks_the_mask(clf):
    for bad in (np.ones((3, 4)), np.ones((4, 2)), np.ones((2,)), np.ones((2, 8))):
        with pytest.raises(ValueError, match=r"mask must have shape \(2, 4\)"):
            kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), bad)
    with pytest.raises(TypeError, match=r"mask must be an \(L, N\) array.*dict"):
        kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), {0: [1]})
    assert 0 <= kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), [[1] * 4, [1] * 4]) <= 1


def test_iterative_pruning_says_when_it_prunes_less_than_asked(clf):
    with pytest.raises(ValueError, match=r"target=0.05 of the 8 heads rounds to 0"):
        kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=0.05, step=0.05)
    with pytest.warns(UserWarning, match=r"pruned 6 of the 7 heads asked.*allow_empty_layers"):
        curve = kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=0.9, step=0.25)
    assert curve.rows[-1]["heads_pruned"] == 6


def test_prune_a_model_with_an_empty_layer_again():
    b = bert(num_layers=2)
    empty = kb.analysis.prune_heads(b, {0: [0, 1, 2, 3]}, allow_empty_layers=True)
    again = kb.analysis.prune_heads(empty, {1: [0]})
    assert again.get_config()["heads_per_layer"] == [0, 3]
    x = inputs()
    ref = to_numpy(b.inspect(x, head_mask=masked({0: [0, 1, 2, 3], 1: [0]}, [4, 4]))[
        "sequence_output"])
    assert np.abs(to_numpy(again(x)["sequence_output"]) - ref).max() <= 1e-5


def test_prune_heads_of_a_task_without_one_backbone_is_a_clear_error():
    d = kb.models.ElectraBackbone(len(VOCAB), 2, 4, 16, 8, 32, max_sequence_length=32)
    e = kb.tasks.ElectraPretrainer(discriminator=d, preprocessor=None, seed=1)
    with pytest.raises(TypeError, match=r"ElectraPretrainer.*its backbone"):
        kb.analysis.prune_heads(e, {0: [1]})


def test_probe_input_errors_name_the_value():
    b = bert(num_layers=1)
    ids = np.random.default_rng(0).integers(5, len(VOCAB), (8, 6)).astype("int32")
    f = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    lab = np.arange(8) % 2
    cases = [
        ((f, np.where(lab == 0, -1, 1)), {}, r"sentence labels.*-1 at example 0"),
        (({k: v[:1] for k, v in f.items()}, lab[:1]), {}, r"validation_split=0.25 of 1 examples"),
        ((f, lab), dict(validation_split=0.99), r"validation_split=0.99 of 8 examples"),
        (({"token_ids": ids}, lab), {}, r"features lack \['padding_mask'\]"),
        (({**f, "token_ids": ids + 100}, lab), {},
         r"token_ids hold 1\d\d, outside the model's vocabulary of 28"),
        (({k: np.tile(v, (1, 6)) for k, v in f.items()}, lab), {},
         r"36 tokens.*max_sequence_length=32"),
        ((f, lab), dict(layers=[]), r"layers is empty"),
        ((f, lab), dict(layers="last"), r"layers must be 'all' or a list of layer indices, got "
                                         r"'last'"),
        ((f, np.zeros((8, 6), "int64")), dict(pooling="max"), r"pooling must be 'mean' or "
                                                              r"'first', got 'max'"),
    ]
    for data, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            kb.analysis.probe(b, data, epochs=1, **kw)
    assert kb.analysis.probe(b, (f, lab), layers=np.int64(1), epochs=1).layers == [1]
    s = np.array([[1, 2]] * 8)
    with pytest.raises(ValueError, match=r"spans1 must be \(B, 2\).*B=8.*\(7, 2\)"):
        kb.analysis.edge_probe(b, (f, s[:-1], s, lab), epochs=1)


def test_attention_maps_and_plot_input_errors_name_the_value(tmp_path):
    b = bert(num_layers=1)
    t = tokenizer()
    with pytest.raises(ValueError, match=r"texts must be a string or a list of strings, got int"):
        kb.analysis.attention_maps(b, 5, tokenizer=t)
    with pytest.raises(ValueError, match=r"texts\[1\] is None"):
        kb.analysis.attention_maps(b, ["a", None], tokenizer=t)
    with pytest.raises(ValueError, match=r"max_length must be an int.*4.5"):
        kb.analysis.attention_maps(b, ["the film"], tokenizer=t, max_length=4.5)
    maps = kb.analysis.attention_maps(b, np.array(["the film"]), tokenizer=t)
    with pytest.raises(ValueError, match=r"layer 1.0 is out of range"):
        kb.analysis.plot_attention(maps, str(tmp_path / "x.png"), layer=1.0, head=0)
    with pytest.raises(ValueError, match=r"is a directory"):
        kb.analysis.plot_attention(maps, str(tmp_path))
    with pytest.raises(ValueError, match=r"\(L, N\) array.*\(0, 0\)"):
        kb.analysis.plot_heads(np.zeros((0, 0)), str(tmp_path / "h.png"))
    curve = kb.analysis.PruningCurve([{"step": 0}], [np.ones((1, 2))], "accuracy")
    with pytest.raises(ValueError, match=r"step 5 is out of range: the curve has 1 steps"):
        curve.plan(5)


def test_longformer_in_analysis_gives_the_true_reasons():
    b = kb.models.LongformerBackbone(len(VOCAB), 1, 2, 16, 32, attention_window=4,
                                     max_sequence_length=32)
    with pytest.raises(ValueError, match=r"banded.*\(N, T, G \+ w \+ 1\)"):
        kb.analysis.attention_maps(b, ["the film"], tokenizer=tokenizer())
    with pytest.raises(ValueError, match=r"'longformer' family.*sliding-window"):
        kb.analysis.prune_heads(b, {0: [1]})
    x = inputs(batch=2, length=8, pad=0)
    x.pop("segment_ids")
    reps = kb.analysis.representations(b, x, layers=[1])  # no global_attention_mask: all local
    assert reps[1].shape == (2, 8, 16)


def test_cli_analyze_user_errors_are_one_line(tmp_path, capsys, clf):
    """An XLNet preset with the default flags (importance skipped, said in the summary); labels
    outside the classes and an --output that is a file: one-line errors naming them."""
    import json

    from keras_bertfam import cli

    xl = kb.tasks.TextClassifier(kb.models.XLNetBackbone(len(VOCAB), 1, 2, 16, 32),
                                 num_classes=2,
                                 preprocessor=ft.TextClassifierPreprocessor(tokenizer(), 16))
    xl.save_to_preset(str(tmp_path / "xlnet"))
    texts = tmp_path / "texts.tsv"
    texts.write_text("the film\t1\ngood story\t0\n", encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["analyze", "--task", str(tmp_path / "xlnet"), "--texts", str(texts),
                     "--output", str(out), "--plot-texts", "0", "--quiet"]) == 0
    assert "skipped" in json.load(open(out / "summary.json"))["importance"]
    clf.save_to_preset(str(tmp_path / "bert"))
    for label in ("2020", "-1"):
        texts.write_text(f"the film\t1\ngood story\t{label}\n", encoding="utf-8")
        capsys.readouterr()
        assert cli.main(["analyze", "--task", str(tmp_path / "bert"), "--texts", str(texts),
                         "--output", str(out), "--plot-texts", "0", "--quiet"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"line 2: label {label}" in err, err
        assert "2 classes" in err, err
    assert cli.main(["analyze", "--task", str(tmp_path / "bert"), "--texts", str(texts),
                     "--output", str(texts), "--quiet"]) == 1
    assert "--output" in capsys.readouterr().err


def test_head_masks_hold_multipliers_in_0_1_and_data_must_end(clf):
    """A NaN or a value outside [0, 1] in a head mask was used as it was (NaN as 0, 5 scaled the
    head's context by 5): refused, naming the entry. An infinite dataset (`.repeat()`) made
    head_importance read forever; a model with no heads left failed deep in the gradient."""
    import tensorflow as tf

    for value, what in ((np.nan, "nan"), (5.0, "5"), (-1.0, "-1")):
        bad = np.ones((2, 4), "float32")
        bad[1, 2] = value
        with pytest.raises(ValueError, match=rf"mask\[1, 2\] is {what}.*\[0, 1\]"):
            kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), bad)
        with pytest.raises(ValueError, match=rf"mask\[1, 2\] is {what}"):
            kb.analysis.head_importance(clf, (TEXTS, LABELS), mask=bad, accuracy_drop=False)
    # past a pruned layer's heads the entries are not heads: NaN there is accepted
    pruned = kb.analysis.prune_heads(clf, {0: [0]})
    ok = np.ones((2, 4), "float32")
    ok[0, 3] = np.nan
    assert 0 <= kb.analysis.evaluate_with_mask(pruned, (TEXTS, LABELS), ok) <= 1
    forever = tf.data.Dataset.from_tensor_slices((TEXTS, LABELS)).batch(2).repeat()
    with pytest.raises(ValueError, match=r"infinite.*take\("):
        kb.analysis.head_importance(clf, forever, accuracy_drop=False)
    empty = kb.analysis.prune_heads(clf, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]},
                                    allow_empty_layers=True)
    for fn in (kb.analysis.head_importance, kb.analysis.iterative_pruning):
        with pytest.raises(ValueError, match=r"no attention head left.*\[0, 0\]"):
            fn(empty, (TEXTS, LABELS))


def test_iterative_pruning_target_and_step_are_checked_numbers():
    """target=1 (every head; the brief of the loop is a fraction in (0, 1]) was refused; a string
    or None target / step failed with a bare '<' TypeError."""
    clf = classifier(bert(num_layers=1, num_heads=2))
    curve = kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), target=1, step=0.5,
                                          allow_empty_layers=True)
    assert [r["heads_pruned"] for r in curve.rows] == [0, 1, 2]
    for kw, match in ((dict(target="0.5"), r"target must be a number.*'0.5'"),
                      (dict(target=None), r"target must be a number.*None"),
                      (dict(target=1.5), r"target must be a fraction of the heads in \(0, 1\]"),
                      (dict(step="x"), r"step must be a number.*'x'"),
                      (dict(step=True), r"step must be a number.*True")):
        with pytest.raises(ValueError, match=match):
            kb.analysis.iterative_pruning(clf, (TEXTS, LABELS), **{"target": 0.5, **kw})


def test_plot_paths_name_an_image_format_and_truncation_names_max_length(tmp_path):
    """A path with an extension matplotlib cannot write ('curve.v1', 'x.txt') failed with
    matplotlib's 'Format not supported', naming no path; a text cut at max_length was said to
    be longer than 'the model's positions'."""
    with pytest.raises(ValueError, match=r"x\.txt.*'\.txt'.*png"):
        kb.analysis.plot_heads(np.ones((2, 2)), str(tmp_path / "x.txt"))
    assert not os.path.exists(tmp_path / "x.txt")
    assert kb.analysis.plot_heads(np.ones((2, 2)), str(tmp_path / "x.svg")).endswith("x.svg")
    b = bert(num_layers=1)
    with pytest.warns(UserWarning, match=r"longer than max_length=8 tokens"):
        kb.analysis.attention_maps(b, ["the film " * 10], tokenizer=tokenizer(), max_length=8)


@pytest.mark.multibackend
@pytest.mark.parametrize("family", ["roberta", "albert", "distil_bert", "electra"])
def test_head_importance_of_every_encoder_family_matches_hf(family, tmp_path):
    """The BERT comparison above for the other head-mask families, converted from their HF
    sequence classifiers (hidden 16, 2 layers): |d loss / d mask| equals HF's to <= 1e-4
    relative. ALBERT shares one attention sublayer between both layers: HF's hook counts the
    calls of that one module to know the layer, and the scores stay per layer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=32, max_position_embeddings=40,
                  num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if family == "roberta":
        hf = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
            **common, pad_token_id=1, bos_token_id=0, eos_token_id=2))
    elif family == "electra":
        hf = transformers.ElectraForSequenceClassification(transformers.ElectraConfig(
            **common, embedding_size=16))
    elif family == "albert":
        hf = transformers.AlbertForSequenceClassification(transformers.AlbertConfig(
            **common, embedding_size=8, num_hidden_groups=1, classifier_dropout_prob=0.0))
    else:
        hf = transformers.DistilBertForSequenceClassification(transformers.DistilBertConfig(
            vocab_size=len(VOCAB), dim=16, n_layers=2, n_heads=4, hidden_dim=32,
            max_position_embeddings=40, num_labels=2, dropout=0.0, attention_dropout=0.0,
            seq_classif_dropout=0.0))
    torch.manual_seed(0)
    hf = hf.eval()
    clf = _converted_classifier(hf, tmp_path)
    if family == "distil_bert":
        modules = [layer.attention.out_lin for layer in hf.distilbert.transformer.layer]
    elif family == "albert":  # one module, called once per layer
        modules = [hf.albert.encoder.albert_layer_groups[0].albert_layers[0].attention.dense]
    else:
        modules = [layer.attention.output.dense
                   for layer in getattr(hf, family).encoder.layer]
    rng = np.random.default_rng(1)
    x = inputs(batch=6, length=8, pad=3)
    x["token_ids"] = rng.integers(5, len(VOCAB), (6, 8)).astype("int32")
    if family == "distil_bert":
        x.pop("segment_ids")
    y = rng.integers(0, 2, (6,)).astype("int32")

    hf_raw = np.zeros((2, 4))
    for rows in (slice(0, 3), slice(3, 6)):  # the batches of batch_size=3
        head_mask = torch.ones(2, 4, requires_grad=True)
        calls = []

        def scale(module, args):
            (context,) = args  # (B, T, N * Hd): each head's context, before the projection
            layer = len(calls)
            calls.append(layer)
            b, t, _ = context.shape
            return (context.reshape(b, t, 4, -1) * head_mask[layer][None, None, :, None]
                    ).reshape(b, t, -1),

        handles = [m.register_forward_pre_hook(scale) for m in modules]
        kw = dict(input_ids=torch.tensor(x["token_ids"][rows], dtype=torch.long),
                  attention_mask=torch.tensor(x["padding_mask"][rows]),
                  labels=torch.tensor(y[rows], dtype=torch.long))
        if "segment_ids" in x and family != "roberta":
            kw["token_type_ids"] = torch.tensor(x["segment_ids"][rows], dtype=torch.long)
        hf(**kw).loss.backward()
        for handle in handles:
            handle.remove()
        assert calls == [0, 1]
        hf_raw += head_mask.grad.abs().numpy()
    result = kb.analysis.head_importance(clf, (x, y), batch_size=3, accuracy_drop=False)
    assert np.abs(result.raw - hf_raw).max() <= 1e-4 * np.abs(hf_raw).max()
    np.testing.assert_allclose(result.importance, kb.analysis.normalize_importance(hf_raw),
                               atol=1e-4)


def test_cli_analyze_refuses_partly_labelled_texts_and_a_dir_without_a_manifest(tmp_path,
                                                                               capsys, clf):
    """One line without a label (or with a label that is not a class id) among labelled lines
    made analyze drop EVERY label silently and score importance on the model's own predictions,
    keeping 'text<TAB>positive' as the text; a --task directory without keras_bertfam.json
    printed a bare '[Errno 2] ...'. Both exit 1 with one line naming the file and line."""
    from keras_bertfam import cli

    task = tmp_path / "bert"
    clf.save_to_preset(str(task))
    texts = tmp_path / "texts.tsv"
    base = ["analyze", "--task", str(task), "--texts", str(texts), "--output",
            str(tmp_path / "out"), "--plot-texts", "0", "--quiet"]
    for content, match in (("the film\t1\ngood story\n", r"line 2 has no label.*line 1"),
                           ("the film\t1\ngood story\tpositive\n",
                            r"line 2 has no label.*'positive'")):
        texts.write_text(content, encoding="utf-8")
        capsys.readouterr()
        assert cli.main(base) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(texts) in err, err
        assert __import__("re").search(match, err), err
    (tmp_path / "plain").mkdir()
    texts.write_text("the film\n", encoding="utf-8")
    assert cli.main(["analyze", "--task", str(tmp_path / "plain"), "--texts", str(texts),
                     "--output", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "keras_bertfam.json" in err and "Errno" not in err, err


@pytest.mark.parametrize("family", ["bert", "roberta", "xlnet"])
def test_attention_maps_equal_hf_output_attentions(family, tmp_path):
    """attention_maps of a converted HF model (the BERT layout [CLS] text [SEP], RoBERTa's
    positions from 2, XLNet's text <sep> <cls> with the content stream) equal HF's
    output_attentions for the same ids, per layer and head, to 1e-5."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=40)
    torch.manual_seed(0)
    if family == "bert":
        hf = transformers.BertModel(transformers.BertConfig(**common))
    elif family == "roberta":
        hf = transformers.RobertaModel(transformers.RobertaConfig(
            **common, pad_token_id=1, bos_token_id=0, eos_token_id=2))
    else:
        hf = transformers.XLNetModel(transformers.XLNetConfig(
            vocab_size=len(VOCAB), d_model=16, n_layer=2, n_head=2, d_inner=32))
    hf.save_pretrained(str(tmp_path / "hf"))
    hf = type(hf).from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    backbone = kb.models.Backbone.from_preset(str(tmp_path / "hf"))
    maps = kb.analysis.attention_maps(backbone, TEXTS[:2], tokenizer=tokenizer())
    t = tokenizer()
    for text, tokens, layers in zip(TEXTS[:2], maps.tokens, maps.maps):
        ids = [t.token_to_id(tok) for tok in tokens]
        kw = {"input_ids": torch.tensor([ids])}
        if family == "xlnet":  # the <cls> has segment 2, as HF's XLNet tokenizer gives it
            kw["token_type_ids"] = torch.tensor([[0] * (len(ids) - 1) + [2]])
        with torch.no_grad():
            ref = hf(**kw, output_attentions=True).attentions
        assert len(ref) == len(layers) == 2
        for got, want in zip(layers, ref):
            np.testing.assert_allclose(got, want[0].numpy(), atol=1e-5)
    assert maps.tokens[0][-1] == ("[CLS]" if family == "xlnet" else "[SEP]")


def test_evaluate_with_mask_metric_and_normalization_exponent_are_checked(clf):
    """evaluate_with_mask(metric='nope') failed with a bare KeyError from inside the traced
    forward pass; normalize_importance(exponent=0) with ZeroDivisionError, a string exponent
    with a NumPy ufunc TypeError. Both now name the value and what is expected."""
    with pytest.raises(ValueError, match=r"metric 'nope'.*TextClassifier.*'accuracy'"):
        kb.analysis.evaluate_with_mask(clf, (TEXTS, LABELS), metric="nope")
    for bad in (0, -2, "x", True):
        with pytest.raises(ValueError, match=rf"exponent must be a positive number.*got.*{bad}"):
            kb.analysis.normalize_importance(np.ones((2, 2)), exponent=bad)
