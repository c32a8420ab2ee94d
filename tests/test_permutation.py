"""PermutationMasker and XLNet packing (tf.data, TensorFlow)."""
import numpy as np
import tensorflow as tf

from keras_bertfam.preprocessing.permutation import (
    PermutationMasker,
    local_permutation,
    longest_first_lengths,
    perm_mask_from_order,
    sample_span_targets,
    start_piece_table,
    xlnet_pack,
)

SEP, CLS = 4, 3


def _stream(batch, length, seed=0):
    ids = np.random.default_rng(seed).integers(10, 100, (batch, length)).astype("int32")
    ids[:, -1], ids[:, -3], ids[:, (3 * length) // 4] = CLS, SEP, SEP  # A <sep> B <sep> <cls>
    return tf.constant(ids)


def test_predicted_fraction_is_one_sixth_and_natural_rate_one_seventh():
    masker = PermutationMasker(512, reuse_len=256, sep_token_id=SEP, cls_token_id=CLS, seed=7)
    assert masker.num_predict == 85
    out = masker(_stream(64, 512))
    fraction = out["input_q"].numpy().mean()
    assert abs(fraction - 1 / 6) <= 0.01, fraction
    assert (out["is_masked"].numpy().sum(1) == 85).all()  # the original's assert
    # Without the top-up, spans cover about n / (n + 6n) = 1/7 (start-piece shifts lower it).
    natural = sample_span_targets(tf.ones([64, 512], tf.bool), tf.constant([3, 4], tf.int64))
    assert abs(natural.numpy().mean() - 1 / 7) <= 0.01


def test_outputs_are_consistent_and_reproducible():
    masker = PermutationMasker(64, num_predict=10, reuse_len=32, sep_token_id=SEP,
                               cls_token_id=CLS, seed=3)
    ids = _stream(8, 64)
    a, b = masker(ids, seed=5), masker(ids, seed=5)
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    c = masker(ids, seed=6)
    assert not np.array_equal(a["perm_mask"].numpy(), c["perm_mask"].numpy())
    tm, target, weight = (a[k].numpy() for k in ("target_mapping", "target", "target_mask"))
    q = a["input_q"].numpy()
    for row in range(8):
        pos = np.nonzero(q[row])[0]
        n = len(pos)
        assert weight[row, :n].all() and not weight[row, n:].any()
        np.testing.assert_array_equal(tm[row, :n].argmax(-1), pos)  # increasing positions
        np.testing.assert_array_equal(target[row, :n], ids.numpy()[row, pos])
        assert not tm[row, n:].any()
        assert not np.isin(ids.numpy()[row, pos], [SEP, CLS]).any()
    perm = a["perm_mask"].numpy()
    assert (perm[:, :32, 32:] == 1).all() and (perm[:, 32:, :32] == 0).all()
    non_target = (q == 0) & ~np.isin(ids.numpy(), [SEP, CLS])
    for row in range(8):  # non-targets are visible to every position of their part and after
        assert (perm[row][:32][:, :32][:, non_target[row, :32]] == 0).all()
        assert (perm[row][32:][:, non_target[row]] == 0).all()


def test_spans_start_at_start_pieces_and_are_at_most_max_gram_tokens():
    pieces = ["<unk>", "<s>", "</s>", "<cls>", "<sep>"] + [
        ("\u2581w%d" if i % 3 == 0 else "x%d") % i for i in range(95)]
    table = np.array(start_piece_table(pieces))
    ids = _stream(16, 256, seed=2).numpy()
    spans = sample_span_targets(tf.constant(table[ids]), tf.constant([1, 1], tf.int64)).numpy()
    for row in range(16):
        m = np.concatenate([[False], spans[row], [False]]).astype(int)
        starts, ends = np.nonzero(np.diff(m) == 1)[0], np.nonzero(np.diff(m) == -1)[0]
        assert len(starts) > 5
        # adjacent spans can touch, so check each maximal run begins at a start piece
        assert table[ids[row, starts]].all()
        assert not spans[row, -1]  # a span never reaches the last position (original quirk)


def test_local_permutation_permutes_within_blocks():
    rank = local_permutation(4, 12, 4, tf.constant([1, 2], tf.int64)).numpy()
    for row in rank:
        for blk in range(3):
            np.testing.assert_array_equal(np.sort(row[blk * 4:(blk + 1) * 4]),
                                          np.arange(blk * 4, blk * 4 + 4))
        # the same offset permutation in every block (the original's reshape/transpose)
        np.testing.assert_array_equal(row[4:8] - 4, row[:4])


def test_perm_mask_from_order_matches_definition():
    rng = np.random.default_rng(0)
    rank = np.stack([rng.permutation(10) for _ in range(3)]).astype("int32")
    target = rng.random((3, 10)) < 0.5
    func = np.zeros((3, 10), bool)
    func[:, -1] = True
    perm = perm_mask_from_order(tf.constant(rank), tf.constant(target), tf.constant(func)).numpy()
    for b in range(3):
        for i in range(10):
            for j in range(10):
                j_plain = not target[b, j] and not func[b, j]
                i_plain = not target[b, i] and not func[b, i]
                if j_plain:
                    expected = 0
                elif i_plain:
                    expected = 1
                elif target[b, i] and not func[b, i]:
                    expected = int(rank[b, j] >= rank[b, i])
                else:  # functional token: sees itself and earlier ones
                    expected = int(rank[b, j] > rank[b, i])
                assert perm[b, i, j] == expected, (b, i, j)


def test_map_dataset_is_vectorized_and_seeded():
    masker = PermutationMasker(32, num_predict=5, sep_token_id=SEP, cls_token_id=CLS, seed=1)
    ds = tf.data.Dataset.from_tensor_slices(_stream(8, 32).numpy()).batch(4)
    mapped = masker.map_dataset(ds)
    first = [e["perm_mask"].numpy() for e in mapped]
    second = [e["perm_mask"].numpy() for e in mapped]
    assert len(first) == 2 and first[0].shape == (4, 32, 32)
    assert not np.array_equal(first[0], second[0])  # fresh orders every epoch
    again = PermutationMasker(32, num_predict=5, sep_token_id=SEP, cls_token_id=CLS, seed=1)
    np.testing.assert_array_equal([e["perm_mask"].numpy() for e in again.map_dataset(ds)][0],
                                  first[0])


def test_xlnet_pack_left_pads_and_puts_special_tokens_at_the_end():
    out = xlnet_pack(tf.ragged.constant([[7, 8, 9], [7]]), tf.ragged.constant([[1, 2], [5]]), 10)
    np.testing.assert_array_equal(out["token_ids"].numpy(),
                                  [[5, 5, 7, 8, 9, 4, 1, 2, 4, 3], [5, 5, 5, 5, 7, 4, 5, 4, 3][:0]
                                   + [5, 5, 5, 5, 5, 7, 4, 5, 4, 3]])
    np.testing.assert_array_equal(out["segment_ids"].numpy()[0], [3, 3, 0, 0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(out["padding_mask"].numpy()[1], [0] * 5 + [1] * 5)
    single = xlnet_pack(tf.ragged.constant([[7, 8, 9, 10, 11]]), sequence_length=4)
    np.testing.assert_array_equal(single["token_ids"].numpy(), [[7, 8, 4, 3]])


def test_longest_first_truncation_matches_popping_from_the_longer():
    for la in range(0, 9):
        for lb in range(0, 9):
            a, b = la, lb
            while a + b > 7:
                if a > b:
                    a -= 1
                else:
                    b -= 1
            got = longest_first_lengths(tf.constant([la]), tf.constant([lb]), 7)
            assert (int(got[0][0]), int(got[1][0])) == (a, b), (la, lb)
