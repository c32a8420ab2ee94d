"""PermutationMasker and XLNet packing (tf.data, TensorFlow)."""
import numpy as np
import pytest
import tensorflow as tf

from keras_bertfam.preprocessing.packing import longest_first_lengths, xlnet_pack
from keras_bertfam.preprocessing.permutation import (
    PermutationMasker,
    local_permutation,
    perm_mask_from_order,
    sample_span_targets,
    start_piece_table,
)
from tests.conftest import default_corpus_documents, python_runs

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


def test_span_targets_of_one_row_in_a_traced_function():
    """A batch of one with a static shape (`XLNetPretrainer(batch_size=1)`'s pipeline) failed to
    trace: the sampling loop's carried rows had shape (1,) on entry and (None,) after a step."""
    starts = tf.constant(np.arange(32) % 3 == 0)[None, :]
    traced = tf.function(lambda s: sample_span_targets(s, tf.constant([1, 2], tf.int64), goal=5))
    spans = traced(starts).numpy()
    assert spans.shape == (1, 32) and spans.sum() == 5


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


# === XLNetPreprocessor ===
class _StubTokenizer:
    """Just what XLNetPreprocessor reads from a tokenizer (for the window layout tests)."""

    sep_token_id, cls_token_id, pad_token_id, mask_token_id, eod_token_id = SEP, CLS, 5, 6, 7

    def get_vocabulary(self):
        return [f"t{i}" for i in range(100)]

    def vocabulary_size(self):
        return 100


def _window(pre, sentence_lengths, seed=0):
    """A synthetic window: ids 1000, 1001, ... (each position's own id) with sentence starts."""
    total = pre.window_tokens
    rng = np.random.default_rng(seed)
    starts = np.zeros(total, bool)
    p = 0
    while p < total:
        starts[p] = True
        p += int(rng.choice(sentence_lengths))
    return tf.constant(np.arange(total, dtype="int32") + 1000), tf.constant(starts), starts


def test_window_examples_follow_split_a_and_b_and_rows_continue_across_steps():
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    T, R, B, S = 36, 12, 6, 10
    pre = XLNetPreprocessor(_StubTokenizer(), sequence_length=T, reuse_len=R, batch_size=B,
                            window_steps=S, seed=0)
    assert pre.row_len == S * R + (T - R - 3) + 1
    ids, starts_t, starts = _window(pre, [3, 4, 7, 9, 25])
    out = pre.window_examples((ids, starts_t), seed=tf.constant([4, 2], tf.int64))
    tokens, segments = out["token_ids"].numpy(), out["segment_ids"].numpy()
    assert tokens.shape == segments.shape == (S, B, T)
    tot, random_b, with_cuts = T - R - 3, 0, 0
    for s in range(S):
        for b in range(B):
            row, seg = tokens[s, b] - 1000, segments[s, b]
            begin = b * pre.row_len + (s + 1) * R
            # The reuse part: row b's tokens [s·R, s·R + R); batch s + 1 continues batch s.
            np.testing.assert_array_equal(row[:R], np.arange(begin - R, begin))
            seps = np.nonzero(tokens[s, b] == SEP)[0]
            assert len(seps) == 2 and tokens[s, b, -1] == CLS and seps[1] == T - 2
            la, lb = seps[0] - R, T - 3 - seps[0]
            assert la >= 1 and lb >= 1 and la + lb == tot  # exactly T tokens, no padding
            np.testing.assert_array_equal(row[R:R + la], np.arange(begin, begin + la))  # A
            b_part = row[seps[0] + 1:T - 2]
            np.testing.assert_array_equal(b_part, np.arange(b_part[0], b_part[0] + lb))
            assert starts[b_part[0]]  # B starts a sentence (a cut point or a grown random span)
            cuts = [p for p in range(begin + 1, begin + tot) if starts[p]]
            with_cuts += bool(cuts)
            if b_part[0] != begin + la or not cuts:
                random_b += bool(cuts)
            else:  # label 1: A ends at a cut point, B continues the text
                assert begin + la in cuts
            np.testing.assert_array_equal(seg, [0] * (R + la + 1) + [1] * (lb + 1) + [2])
    assert 0.3 <= random_b / with_cuts <= 0.7, (random_b, with_cuts)


def test_window_examples_truncate_the_longer_part_as_the_original():
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    pre = XLNetPreprocessor(_StubTokenizer(), sequence_length=24, reuse_len=4, batch_size=2,
                            window_steps=3)
    # One sentence per 100 tokens: no cut point, A runs to the sentence end, B gets 1 token then
    # grows to a whole sentence: both are cut to tot = 17 with the longer losing first.
    ids, starts_t, _ = _window(pre, [100])
    out = pre.window_examples((ids, starts_t), seed=3)["token_ids"].numpy()
    for example in out.reshape(-1, 24):
        seps = np.nonzero(example == SEP)[0]
        assert seps[0] - 4 == 9 and 24 - 3 - seps[0] == 8  # longest_first_lengths(big, big, 17)


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory):
    """An XLNet SentencePiece tokenizer of 400 pieces, trained once on the default corpus' first
    150 documents (`default_corpus_documents`: its bytes without starting its pipeline)."""
    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer, \
        train_xlnet_sentencepiece_model

    path = str(tmp_path_factory.mktemp("tiny_spm") / "spiece.model")
    train_xlnet_sentencepiece_model(list(default_corpus_documents(0, 150)), 400, output_file=path)
    return XLNetTokenizer(path)


def test_prepare_gives_parallel_streams_reproducibly(tiny_spm):
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    tok = tiny_spm
    docs = [d.decode() for d in default_corpus_documents(500, 60)]  # default_corpus()[500:560]
    T, R, B, S = 48, 16, 4, 3
    pre = XLNetPreprocessor(tok, sequence_length=T, reuse_len=R, batch_size=B, window_steps=S,
                            seed=11)
    batches = list(pre.prepare(docs))
    again = list(pre.prepare(docs))
    stream_ids, _ = pre.token_stream(tf.constant(docs))
    stream = stream_ids.numpy()
    assert (stream == tok.eod_token_id).sum() == len(docs)  # <eod> after every document
    assert len(batches) == S * (len(stream) // pre.window_tokens) >= 2 * S
    for (x, y, w), (x2, y2, w2) in zip(batches, again):
        for k in x:
            np.testing.assert_array_equal(x[k].numpy(), x2[k].numpy())
        np.testing.assert_array_equal(y.numpy(), y2.numpy())
    for i, (x, y, w) in enumerate(batches):
        assert x["token_ids"].shape == (B, T) and x["perm_mask"].shape == (B, T, T)
        assert x["target_mapping"].shape == (B, pre.num_predict, T)
        assert (x["padding_mask"].numpy() == 1).all()
        assert (x["token_ids"].numpy()[:, -1] == tok.cls_token_id).all()
        mapped = np.einsum("bpt,bt->bp", x["target_mapping"].numpy(), x["token_ids"].numpy())
        np.testing.assert_array_equal(mapped * w.numpy(), y.numpy() * w.numpy())
        window, step = divmod(i, S)
        for b in range(B):  # row b's reuse part is the stream at its row's offset + step·R
            start = window * pre.window_tokens + b * pre.row_len + step * R
            np.testing.assert_array_equal(x["token_ids"].numpy()[b, :R],
                                          stream[start:start + R])


def test_prepare_traces_its_graphs_once_per_preprocessor(tiny_spm, monkeypatch):
    """Each `prepare` traced the token stream, the windows and the permutation masking again
    (`Dataset.map` traces its function for each new dataset; BUILD.md, session 47: 3.1-3.7 s
    of CPU a call on 4 short texts). They are `tf.function`s
    made once per preprocessor (`_traced`): the second `prepare` traces none, and its batches
    are the first's, bit for bit."""
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

    tok = tiny_spm
    runs = python_runs(monkeypatch, (PermutationMasker, "__call__"),
                       (XLNetPreprocessor, "window_examples"), (XLNetPreprocessor, "token_stream"))
    pre = XLNetPreprocessor(tok, sequence_length=16, batch_size=2, window_steps=1, seed=1)
    docs = [f"The film number {i} was great. The actor lives in Paris." for i in range(40)]
    first = list(pre.prepare(docs))
    assert runs == {"PermutationMasker.__call__": 1, "XLNetPreprocessor.window_examples": 1,
                    "XLNetPreprocessor.token_stream": 1}
    again = list(pre.prepare(docs))
    assert sum(runs.values()) == 3  # before: each traced again
    assert len(again) == len(first) >= 2
    for a, b in zip(first, again):
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
            np.testing.assert_array_equal(x, y)
