"""SpanBERT: backbone/presets, span boundaries from the masker, the SBO head, the pretrainer."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from keras_bertfam.layers import SpanBoundaryHead, span_boundary_weights
from keras_bertfam.preprocessing.masking import SpanMasker, span_boundaries
from tests.conftest import to_numpy

# One layer: the SBO head and the losses read the last layer's output; the depth is not checked.
TINY = dict(vocabulary_size=60, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=16, dropout=0.0)


def batch(b=8, t=12, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, 60, (b, t)).astype("int32")
    ids[:, 0], ids[:, -1] = 2, 3
    positions = np.tile(np.array([[3, 4, 5, 8, 10]], "int32"), (b, 1))
    weights = np.ones(positions.shape, "float32")
    positions[0, 4], weights[0, 4] = 0, 0.0
    starts, ends = (to_numpy(v) for v in span_boundaries(positions, weights))
    mask_ids = np.take_along_axis(ids, positions, 1) * (weights > 0)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, 1)
    masked[:, 0] = 2
    x = {"token_ids": masked, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids),
         "mask_positions": positions, "span_starts": starts, "span_ends": ends}
    return x, mask_ids, weights


def test_presets():
    for name in ("spanbert_base_en", "spanbert_large_en"):
        preset = kb.presets.get(name)
        assert kb.presets.count_params(name) == preset.params
        assert preset.config["vocabulary_size"] == 28996
        assert preset.tokenizer["lowercase"] is False
    # The count is what the config builds (small config: building Base takes long on CPU).
    backbone = kb.models.SpanBertBackbone(**TINY)
    assert kb.presets.count_params(kb.presets.get("spanbert_base_en").__class__(
        "tiny", "spanbert", TINY, {}, 0)) == backbone.num_params()


def test_bert_format_checkpoint_loads_as_spanbert(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=20)).eval()
    path = str(tmp_path / "hf")
    hf.save_pretrained(path)
    ours = kb.models.SpanBertBackbone.from_preset(path)
    assert type(ours) is kb.models.SpanBertBackbone
    ids = np.random.RandomState(0).randint(0, 99, (2, 7))
    mask = np.ones_like(ids)
    out = to_numpy(ours({"token_ids": ids, "segment_ids": np.zeros_like(ids),
                         "padding_mask": mask})["sequence_output"])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
    assert np.abs(out - ref).max() <= 1e-4


def test_span_masker_returns_span_boundaries():
    masker = SpanMasker(vocabulary_size=100, mask_token_id=4, unselectable_token_ids=(0, 1, 2),
                        padding_token_id=0, mask_selection_length=20, seed=3,
                        return_span_boundaries=True)
    ids = np.full((16, 64), 0, "int32")
    ids[:, 1:40] = np.random.RandomState(0).randint(10, 100, (16, 39))
    ids[:, 0], ids[:, 40] = 1, 2
    out = {k: v.numpy() for k, v in masker(tf.constant(ids)).items()}
    assert {"span_starts", "span_ends"} <= set(out)
    for row in range(16):
        masked = set(out["mask_positions"][row][out["mask_weights"][row] > 0].tolist())
        for p, w, s, e in zip(out["mask_positions"][row], out["mask_weights"][row],
                              out["span_starts"][row], out["span_ends"][row]):
            if not w:
                assert s == e == 0
                continue
            assert s <= p <= e and set(range(s, e + 1)) <= masked
            assert s - 1 not in masked and e + 1 not in masked
    assert SpanMasker.from_config(masker.get_config()).return_span_boundaries


@pytest.mark.multibackend
def test_sbo_head_shapes_and_edges():
    embedding = keras.layers.Embedding(50, 16)
    embedding.build((None,))
    head = SpanBoundaryHead(embedding, max_span_length=4, position_embedding_dim=8)
    sequence = keras.random.normal((2, 7, 12), seed=0)
    positions = np.array([[1, 2, 5], [0, 3, 6]])
    starts = np.array([[1, 1, 5], [0, 3, 3]])
    ends = np.array([[2, 2, 6], [0, 3, 6]])
    logits = head(sequence, positions, starts, ends)
    assert tuple(logits.shape) == (2, 3, 50)
    # Input width 2H + D into the first layer, output tied to the V x E table.
    assert tuple(head.dense_1.kernel.shape) == (2 * 12 + 8, 12)
    assert tuple(head.dense_2.kernel.shape) == (12, 16)
    padding = np.array([[1] * 7, [1] * 7])
    weights = to_numpy(span_boundary_weights(starts, ends, padding))
    # [0,0]: boundaries 0 and 3 -> valid; [0,2]: e+1 = 7 = length -> edge; [1,0]: s = 0 -> edge.
    np.testing.assert_array_equal(weights, [[1, 1, 0], [0, 1, 0]])
    padding[0, 5:] = 0  # a shorter row: e + 1 must stay inside the real tokens
    np.testing.assert_array_equal(to_numpy(span_boundary_weights(starts, ends, padding))[0],
                                  [1, 1, 0])
    # The prediction depends on the boundary states and the offset, not on the masked states.
    changed = to_numpy(sequence).copy()
    changed[0, 1:3] += 5.0  # the span's own tokens
    again = head(changed, positions, starts, ends)
    np.testing.assert_allclose(to_numpy(again)[0, :2], to_numpy(logits)[0, :2], atol=1e-5)
    assert not np.allclose(to_numpy(logits)[0, 0], to_numpy(logits)[0, 1])  # offsets 0 and 1
    # Offsets beyond the table are clipped to its last row.
    far = head(sequence, np.array([[6, 6, 6], [6, 6, 6]]), np.zeros((2, 3), "int32"),
               np.full((2, 3), 6))
    near = head(sequence, np.array([[3, 3, 3], [3, 3, 3]]), np.zeros((2, 3), "int32"),
                np.full((2, 3), 6))
    np.testing.assert_allclose(to_numpy(far), to_numpy(near), atol=1e-5)


@pytest.mark.multibackend
def test_loss_falls():
    model = kb.tasks.SpanBertPretrainer(kb.models.SpanBertBackbone(**TINY))
    model.compile(learning_rate=5e-3)
    x, y, w = batch()
    history = model.fit(x, y, sample_weight=w, batch_size=8, epochs=15, verbose=0).history
    assert history["loss"][-1] < 0.8 * history["loss"][0]
    assert history["sbo_loss"][-1] < history["sbo_loss"][0]
    assert history["mlm_loss"][-1] < history["mlm_loss"][0]


def test_loss_is_mlm_plus_sbo():
    model = kb.tasks.SpanBertPretrainer(kb.models.SpanBertBackbone(**TINY))
    x, y, w = batch()
    out = model(x)
    loss, values = model.losses_and_metrics(y, out, w)
    np.testing.assert_allclose(to_numpy(loss), to_numpy(values["mlm_loss"] + values["sbo_loss"]),
                               rtol=1e-6)
    # Every slot here has both boundaries inside the sequence; an edge span gets weight 0.
    np.testing.assert_array_equal(to_numpy(out["sbo_weights"]), w)  # 0 only at the pad slot
    edge = dict(x, span_starts=np.zeros_like(x["span_starts"]))
    assert to_numpy(model(edge)["sbo_weights"]).sum() == 0


def test_save_reload(tmp_path):
    model = kb.tasks.SpanBertPretrainer(kb.models.SpanBertBackbone(**TINY), max_span_length=12)
    x, _, _ = batch()
    path = str(tmp_path / "spanbert.keras")
    model.save(path)
    before = model.predict(x, verbose=0)
    loaded = keras.saving.load_model(path)
    assert loaded.max_span_length == 12
    for key, value in loaded.predict(x, verbose=0).items():
        np.testing.assert_allclose(value, before[key], atol=1e-5, err_msg=key)
    model.save_to_preset(str(tmp_path / "preset"))
    again = kb.tasks.SpanBertPretrainer.from_preset(str(tmp_path / "preset"), preprocessor=None,
                                                    max_span_length=12)
    for key, value in again.predict(x, verbose=0).items():
        np.testing.assert_allclose(value, before[key], atol=1e-5, err_msg=key)


@pytest.mark.multibackend
def test_span_boundaries_outside_the_rows_or_not_around_their_slot_are_refused():
    """preprocessor=None: `span_starts` / `span_ends` outside the rows were gathered clipped and
    their slots weighted out of the SBO loss, silently; a span ending before it starts was
    weighted out silently too; a slot's position outside its span gave the SBO head an offset
    clipped to 0 and another span's boundaries (a wrong SBO loss, silently). Refused naming the
    values, as `mask_positions` outside the rows are: in memory, in a `tf.data` dataset and
    from a Python generator."""
    model = kb.tasks.SpanBertPretrainer(
        kb.models.SpanBertBackbone(**dict(TINY, num_layers=1, hidden_dim=16, intermediate_dim=32)),
        preprocessor=None, position_embedding_dim=8)
    x, y, w = batch(b=2)  # slots at 3, 4, 5 (one span), 8, 10; row 0's last slot is padding
    rows = r"for rows of 12 positions: expected positions in \[0, 12\)"
    in_batch = r"in a batch of rows of 12 positions: expected positions in \[0, the rows' length\)"
    order = r"expected span_starts <= mask_positions <= span_ends"

    def changed(key, row, slot, value):
        values = x[key].copy()
        values[row, slot] = value
        return dict(x, **{key: values})

    cases = [
        (changed("span_ends", 1, 4, 12), r"span_ends from 0 to 12 " + rows,
         r"span_ends from 0 to 12 " + in_batch),
        (changed("span_starts", 1, 3, -1), r"span_starts from -1 to 10 " + rows,
         r"span_starts from -1 to 10 " + in_batch),
        (changed("span_ends", 1, 0, 2),  # ends before it starts
         r"a span from 3 to 2 for mask_positions 3 at \[1, 0\]: " + order,
         r"a span from 3 to 2 for mask_positions 3 at \[1, 0\] of a batch: " + order),
        (changed("span_starts", 0, 3, 9),  # (9, 8): position 8 before its span
         r"a span from 9 to 8 for mask_positions 8 at \[0, 3\]: " + order,
         r"a span from 9 to 8 for mask_positions 8 at \[0, 3\] of a batch: " + order),
        (changed("mask_positions", 0, 0, 7),  # 7 outside the span (3, 5) given for it
         r"a span from 3 to 5 for mask_positions 7 at \[0, 0\]: " + order,
         r"a span from 3 to 5 for mask_positions 7 at \[0, 0\] of a batch: " + order),
    ]
    for features, message, graph_message in cases:
        with pytest.raises(ValueError, match=r"SpanBertPretrainer got " + message):
            model.fit(features, y, sample_weight=w, verbose=0)
        with pytest.raises(ValueError, match=r"SpanBertPretrainer got " + message):
            model.fit(((features, y, w) for _ in range(1)), verbose=0)
        # (predict: the same input pipeline as fit's, a cheaper step to trace)
        with pytest.raises(Exception, match=r"SpanBertPretrainer got " + graph_message):
            model.predict(tf.data.Dataset.from_tensor_slices(features).batch(2), verbose=0)
    # the preprocessor's spans pass (its padding slot: position and span 0)
    for data in (x, tf.data.Dataset.from_tensor_slices(x).batch(2)):
        assert model.predict(data, verbose=0)["sbo_logits"].shape == (2, 5, 60)
