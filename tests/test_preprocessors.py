"""Pretraining preprocessors: raw text -> keras-hub format; truncation; seeds; BERT's masking."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import python_runs


@pytest.fixture(scope="module")
def tokenizer(bert_vocab):
    return kb.preprocessing.WordPieceTokenizer(vocabulary=bert_vocab, lowercase=True)


def test_long_text_is_truncated_to_the_sequence(tokenizer):
    """Documented: a segment longer than the sequence is cut at its end; [SEP] stays last."""
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, seed=0)
    x, mask_ids, weights = pre(tf.constant(["word " * 100, "short text"]))
    ids = x["token_ids"].numpy()
    assert ids.shape == (2, 16)
    assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
    assert x["padding_mask"].numpy()[0].all()
    # The unmasked tokens of the long text are its first 14 word pieces.
    original = ids[0].copy()
    for p, m, w in zip(x["mask_positions"].numpy()[0], mask_ids.numpy()[0], weights.numpy()[0]):
        if w:
            original[p] = m
    assert original[1:15].tolist() == tokenizer(["word " * 14]).to_list()[0]


def test_masking_follows_bert(tokenizer):
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 128, batch_size=64, seed=3)
    docs = kb.preprocessing.read_corpus().take(640)
    masked = real = predicted = 0
    replaced_with_mask = 0
    for x, mask_ids, weights in pre.prepare(docs):
        weights = weights.numpy().astype(bool)
        n = x["padding_mask"].numpy().sum(1)
        expected = np.minimum(20, np.maximum(1, np.round(n * 0.15)))
        np.testing.assert_array_equal(weights.sum(1), expected)  # BERT's num_to_predict
        positions = x["mask_positions"].numpy()
        ids = x["token_ids"].numpy()
        originals = mask_ids.numpy()[weights]
        assert not np.isin(originals, tokenizer.special_token_ids).any()
        at = np.take_along_axis(ids, positions, 1)[weights]
        replaced_with_mask += (at == tokenizer.mask_token_id).sum()
        predicted += weights.sum()
        real += n.sum()
    assert abs(predicted / real - 0.15) < 0.005
    assert abs(replaced_with_mask / predicted - 0.8) < 0.02


def test_same_seed_same_examples_new_mask_each_epoch(tokenizer):
    docs = kb.preprocessing.read_corpus().take(32)

    def first_epochs(seed):
        pre = kb.preprocessing.SentencePairPreprocessor(tokenizer, 64, batch_size=8, seed=seed)
        ds = pre.prepare(docs)
        return [[b[0]["token_ids"].numpy() for b in ds] for _ in range(2)]

    a, b = first_epochs(5), first_epochs(5)
    for epoch_a, epoch_b in zip(a, b):
        for x, y in zip(epoch_a, epoch_b):
            np.testing.assert_array_equal(x, y)
    assert any((x != y).any() for x, y in zip(a[0], a[1]))  # dynamic: epoch 2 differs


def test_pairs_fit_the_sequence_and_labels_are_binary(tokenizer):
    pre = kb.preprocessing.SentencePairPreprocessor(tokenizer, 48, batch_size=16, seed=1)
    for x, y in pre.prepare(kb.preprocessing.read_corpus().take(64)):
        ids, seg = x["token_ids"].numpy(), x["segment_ids"].numpy()
        assert ids.shape[1] == 48
        assert (ids[:, 0] == tokenizer.cls_token_id).all()
        assert ((ids == tokenizer.sep_token_id).sum(1) == 2).all()
        assert set(np.unique(y["pair_labels"].numpy())) <= {0, 1}
        assert (seg.max(1) == 1).all()


def test_empty_and_non_string_input(tokenizer):
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16)
    with pytest.raises(TypeError, match="strings"):
        pre.prepare(tf.data.Dataset.from_tensor_slices([1, 2]))
    x, _, weights = pre(tf.constant([""]))
    assert x["padding_mask"].numpy().sum() == 2 and weights.numpy().sum() == 0  # [CLS] [SEP]
    with pytest.raises(ValueError, match="sequence_length"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer, 2)


def test_corrupt_weights_in_a_preset_dir(tmp_path):
    backbone = kb.models.BertBackbone(120, 1, 2, 8, 16, max_sequence_length=16)
    backbone.save_to_preset(str(tmp_path))
    with open(tmp_path / "backbone.weights.h5", "wb") as f:
        f.write(b"\x89HDF\r\n garbage")
    with pytest.raises(ValueError, match="corrupt"):
        kb.models.BertBackbone.from_preset(str(tmp_path))


@pytest.mark.parametrize("kind", ["pairs", "blocks"])
def test_instances_are_shuffled_across_documents(tokenizer, kind):
    """A document gives several consecutive instances; training batches mix documents (a seeded
    buffer, as BERT shuffles its instances), evaluation and shuffle_buffer=0 keep the order."""
    words = ["apple", "river", "music", "house", "green", "paper", "stone", "cloud"]
    docs = [" ".join(f"{w} {w} {w} {w}." for _ in range(40)) for w in words]
    word_ids = {tokenizer([w]).to_list()[0][0]: w for w in words}

    @functools.cache  # one preprocessor (its map functions traced once) per setting
    def preprocessor(shuffle_buffer, seed):
        if kind == "pairs":
            return kb.preprocessing.SentencePairPreprocessor(
                tokenizer, 32, batch_size=16, seed=seed, shuffle_buffer=shuffle_buffer)
        return kb.preprocessing.MaskedLMPreprocessor(
            tokenizer, 32, batch_size=16, seed=seed, packing="doc_sentences",
            shuffle_buffer=shuffle_buffer)

    def first_batch_documents(shuffle_buffer, seed=0, training=True, fresh=False):
        # a new pipeline on each call; `fresh`: of a preprocessor of its own
        pre = (preprocessor.__wrapped__ if fresh else preprocessor)(shuffle_buffer, seed)
        x = next(iter(pre.prepare(tf.data.Dataset.from_tensor_slices(docs).batch(8),
                                  training=training)))[0]
        rows = x["token_ids"].numpy()
        # The document of an instance: its first word (NSP's random B may come from another).
        return [next(word_ids[t] for t in row if t in word_ids) for row in rows], rows

    ordered, _ = first_batch_documents(0)
    assert len(set(ordered)) <= 3  # 16 instances: a few consecutive documents
    assert first_batch_documents(1024, training=False)[0] == ordered
    shuffled, rows = first_batch_documents(1024)
    assert len(set(shuffled)) >= 5
    # same seed, same batch (another preprocessor's pipeline)
    np.testing.assert_array_equal(first_batch_documents(1024, fresh=True)[1], rows)
    assert not np.array_equal(first_batch_documents(1024, seed=1)[1], rows)


@pytest.mark.parametrize("kind", ["pairs", "blocks"])
def test_training_batches_are_full_unless_an_epoch_has_only_one(tokenizer, kind):
    """An epoch's last partial training batch is dropped: pairs and blocks are redrawn every
    epoch, so its size changed every epoch and JAX compiled the train step again for each. An
    epoch with fewer instances than a batch keeps that one batch; evaluation keeps every one."""
    docs = kb.preprocessing.read_corpus().take(12)

    @functools.cache  # one preprocessor (its map functions traced once) per batch size
    def preprocessor(batch_size):
        if kind == "pairs":
            return kb.preprocessing.SentencePairPreprocessor(tokenizer, 32,
                                                             batch_size=batch_size, seed=2)
        return kb.preprocessing.MaskedLMPreprocessor(tokenizer, 32, batch_size=batch_size,
                                                     seed=2, packing="full_sentences")

    def sizes(batch_size, training, epochs=2):
        ds = preprocessor(batch_size).prepare(docs, training=training)
        return [[int(x["token_ids"].shape[0]) for x, *_ in ds] for _ in range(epochs)]

    evaluation, = sizes(8, training=False, epochs=1)  # each epoch read costs ~1 s of CPU
    assert evaluation[-1] < 8  # the instances do not fill whole batches
    for epoch in sizes(8, training=True):
        assert len(epoch) >= 3 and set(epoch) == {8}
        assert abs(len(epoch) - len(evaluation)) <= 1 + len(evaluation) // 5  # pairs vary
    (one,), (again,) = sizes(4096, training=True)
    assert 0 < one < 4096 and 0 < again < 4096


@pytest.mark.parametrize("kind", ["pairs", "blocks"])
def test_group_by_length_regroups_the_same_examples_and_cuts_the_padding(tokenizer, kind):
    """HF Trainer's group_by_length for pretraining: the very examples and masks drawn without
    it, sorted by length within groups of `group_by_length_batches` batches (longest first) and
    each batch cut to its longest row (rounded up to `pad_to_multiple_of`); evaluation keeps
    the order and the full width."""
    docs = kb.preprocessing.read_corpus().take(24)  # 35-36 batches of 4: 7 groups of 5 and more
    length = 64

    @functools.cache  # one preprocessor (its map functions traced once) per setting
    def preprocessor(**kwargs):
        if kind == "pairs":
            pre = kb.preprocessing.SentencePairPreprocessor(tokenizer, length, batch_size=4,
                                                            seed=1, **kwargs)
        else:
            pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, length, batch_size=4, seed=1,
                                                        packing="full_sentences", **kwargs)
        pre.group_by_length_batches = 5
        return pre

    def batches(training=True, take=-1, **kwargs):
        return [(b[0], tf.nest.flatten(b[1:]))
                for b in preprocessor(**kwargs).prepare(docs, training=training).take(take)]

    def examples(batches):  # every row: its real tokens, segments, masks and targets
        rows = []
        for x, targets in batches:
            n = x["padding_mask"].numpy().sum(1)
            for i in range(len(n)):
                rows.append((x["token_ids"].numpy()[i, :n[i]].tolist(),
                             x["segment_ids"].numpy()[i, :n[i]].tolist(),
                             x["mask_positions"].numpy()[i].tolist(),
                             [t.numpy()[i].tolist() for t in targets]))
        return sorted(rows)

    plain, grouped = batches(), batches(group_by_length=True)
    assert len(grouped) == len(plain) >= 10 and examples(grouped) == examples(plain)
    longest = [int(x["padding_mask"].numpy().sum(1).max()) for x, _ in grouped]
    for x, _ in grouped:
        assert {x[k].shape[1] for k in ("token_ids", "segment_ids", "padding_mask")} == {
            int(x["padding_mask"].numpy().sum(1).max())}
        assert (x["mask_positions"].numpy() < x["token_ids"].shape[1]).all()
    for start in range(0, len(grouped), 5):
        assert longest[start:start + 5] == sorted(longest[start:start + 5], reverse=True)
    assert sum(x["token_ids"].numpy().size for x, _ in grouped) < sum(
        x["token_ids"].numpy().size for x, _ in plain)
    eights = batches(group_by_length=True, pad_to_multiple_of=8, take=5)  # the first group
    assert [x["token_ids"].shape[1] for x, _ in eights] == [
        min(length, -(-n // 8) * 8) for n in longest[:5]]
    (evaluation, _), = batches(training=False, group_by_length=True, take=1)
    assert evaluation["token_ids"].shape[1] == length


@pytest.mark.parametrize("kind", ["nsp", "sop", "segments", "blocks", "span"])
def test_prepare_traces_the_tokenizer_and_masker_once_per_preprocessor(tokenizer, kind,
                                                                       monkeypatch):
    """`Dataset.map` traces its function for each new dataset: every `prepare` (each pipeline
    a fit builds: one per fit, and `prepare_epochs`' own) traced the tokenizer's, pairer's and
    masker's graphs again. A preprocessor's map functions are `tf.function`s made once
    (`_traced`): a second `prepare`, the epoch pipeline included, traces none of them, and
    gives the same batches; nor does a new seed (it gives new draws); a new masker is traced
    anew (nothing stale runs)."""
    make = {  # (the pretrainers' default preprocessors need no backbone)
        "nsp": lambda: kb.tasks.BertPretrainer.default_preprocessor(tokenizer, None, 16),
        "sop": lambda: kb.tasks.AlbertPretrainer.default_preprocessor(tokenizer, None, 16),
        "segments": lambda: kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16),
        "blocks": lambda: kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16,
                                                                packing="full_sentences"),
        "span": lambda: kb.preprocessing.SpanBertPreprocessor(tokenizer, 16),
    }[kind]
    pre = make()
    pre.seed, pre.batch_size = 5, 2
    runs = python_runs(monkeypatch, (type(tokenizer), "tokenize"),
                       (type(pre.masker), "__call__"))
    docs = [". ".join(f"the film number {i + j} was long" for j in range(3)) + "."
            for i in range(6)]
    first = [tf.nest.flatten(b) for b in pre.prepare(docs)]
    traced = dict(runs)
    # the masker traced for this preprocessor; the tokenizer's traced function is the tokenizer's
    # own, made once per input rank (test_tokenizers), here or by an earlier test of the module
    masker_calls, tokenizes = traced[f"{type(pre.masker).__name__}.__call__"], traced[
        f"{type(tokenizer).__name__}.tokenize"]
    assert masker_calls and tokenizes <= 1, traced
    again = [tf.nest.flatten(b) for b in pre.prepare(docs)]
    epochs = tf.data.Dataset.range(2).map(lambda e: (e, tf.constant(0, tf.int64)))
    documents = tf.data.Dataset.from_tensor_slices(docs)
    assert next(iter(pre.prepare_epochs(documents, epochs, shuffle_batch_size=3)))
    assert runs == traced  # before: each count doubled, then tripled
    for a, b in zip(first, again, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    pre.seed = 6  # as the CLI's each checkpoint chunk: new draws, read outside the functions
    reseeded = [tf.nest.flatten(b) for b in pre.prepare(docs)]
    assert runs == traced  # before: traced anew for each seed
    assert any(not np.array_equal(x, y) for a, b in zip(first, reseeded) for x, y in zip(a, b))
    other = make()
    pre.masker = other.masker  # seed 0 (the default masker's: the preprocessor's seed)
    changed = [tf.nest.flatten(b) for b in pre.prepare(docs)]
    assert sum(runs.values()) > sum(traced.values())
    assert any(not np.array_equal(x, y) for a, b in zip(first, changed) for x, y in zip(a, b))


def test_group_by_length_arguments_are_checked_and_saved(tokenizer):
    with pytest.raises(ValueError, match="group_by_length must be True or False, got 'yes'"):
        kb.preprocessing.SentencePairPreprocessor(tokenizer, 32, group_by_length="yes")
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive int or 'auto', "
                                         "got 0"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer, 32, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="XLNetPreprocessor takes no group_by_length=True"):
        kb.preprocessing.XLNetPreprocessor(tokenizer, 32, group_by_length=True)
    pre = kb.preprocessing.SentencePairPreprocessor(tokenizer, 32, group_by_length=True,
                                                    pad_to_multiple_of=8)
    again = kb.preprocessing.SentencePairPreprocessor.from_config(pre.get_config())
    assert (again.group_by_length, again.pad_to_multiple_of) == (True, 8)


def test_word_maskers_of_the_default_preprocessors_use_the_tokenizers_words(tokenizer):
    """ALBERT's n-grams and SpanBERT's spans are whole words of the tokenizer in use (its kind
    decides how word starts look): with a WordPiece vocabulary, ALBERT must still mask ~15% and
    SpanBERT must never cut a word (no masked piece next to an unmasked piece of its word)."""
    backbone = kb.models.BertBackbone(tokenizer.vocabulary_size(), 1, 2, 16, 32,
                                      max_sequence_length=64)
    text = ("Unbelievably, the screenwriters' overwrought dialogue undermines an otherwise "
            "extraordinary performance. ") * 6
    docs = tf.data.Dataset.from_tensor_slices([text] * 16).batch(16)
    albert = kb.tasks.AlbertPretrainer.default_preprocessor(tokenizer, backbone, 64, seed=0)
    x, y = next(iter(albert.prepare(docs)))
    assert y["mask_weights"].numpy().sum(1).min() >= 0.1 * 64

    span = kb.tasks.SpanBertPretrainer.default_preprocessor(tokenizer, backbone, 64, seed=0)
    continues = np.array([t.startswith("##") for t in tokenizer.get_vocabulary()])
    checked = 0
    for x, mask_ids, weights in span.prepare(tf.data.Dataset.from_tensor_slices([text] * 32)):
        for ids, positions, original, w in zip(x["token_ids"].numpy(), x["mask_positions"].numpy(),
                                               mask_ids.numpy(), weights.numpy()):
            real = w > 0
            ids = ids.copy()
            ids[positions[real]] = original[real]  # the unmasked text
            masked = np.zeros(len(ids), bool)
            masked[positions[real]] = True
            inside = continues[ids[1:]]  # piece t + 1 continues the word of piece t
            np.testing.assert_array_equal(masked[1:][inside], masked[:-1][inside])
            checked += int(inside.sum())
    assert checked > 100


def test_masked_lm_token_blocks_fill_every_row(tokenizer):
    """`packing="token_blocks"` (fairseq's break mode "none", HF run_mlm's grouped texts): the
    documents' tokens in full blocks, so the only padding is each batch of documents' last block;
    FULL-SENTENCES on the same documents pads wherever the next sentence does not fit."""
    docs = kb.preprocessing.read_corpus().take(64)

    def rows(packing):
        pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 64, batch_size=8, seed=1,
                                                    packing=packing)
        return np.concatenate([x["padding_mask"] for x, *_ in pre.prepare(docs, training=False)])

    blocks, sentences = rows("token_blocks"), rows("full_sentences")
    assert (blocks.sum(axis=1) < 64).sum() <= 64 // 8  # one short block per batch of documents
    # The same tokens ([CLS]/[SEP] around each block aside) in fewer rows; FULL-SENTENCES also
    # drops a document separator that would start a block.
    extra_separators = (blocks.sum() - 2 * len(blocks)) - (sentences.sum() - 2 * len(sentences))
    assert 0 <= extra_separators < 64 and len(blocks) < len(sentences)
    assert blocks.mean() > 0.97 > sentences.mean()
    with pytest.raises(ValueError, match="token_blocks.*'blocks'"):
        kb.preprocessing.MaskedLMPreprocessor(tokenizer, 64, packing="blocks")


def test_batches_per_epoch_is_the_pipelines_length_without_building_it(tokenizer):
    """`batches_per_epoch` (a pretraining fit's steps an epoch, so its schedule's total steps,
    found before its one pipeline is built) is the length of `prepare`'s pipeline on the same
    input where that is known, without calling `prepare`: MaskedLM's segments, one batch of
    each input batch, of strings batched by the preprocessor or already batched, or shuffled
    and batched by the fit (`shuffle_batch_size`, 10 texts in batches of 4: 3). None where the
    length is found only by reading the data: pairs, blocks, regrouped batches, an input of
    unknown length. A subclass whose `prepare` does not say (`_batches_of`) is counted on its
    own pipeline; empty or non-string input fails as in `prepare`. (Pairs' and blocks'
    pipelines, 2-3 s of CPU each to build, are not built here: they unbatch, their length is
    unknown.)"""
    texts = [f"text number {i}. it has two sentences." for i in range(10)]
    strings = tf.data.Dataset.from_tensor_slices(texts)
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, batch_size=4, seed=0)
    grouped = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, batch_size=4,
                                                    group_by_length=True)
    blocks = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, batch_size=4,
                                                   packing="full_sentences")
    pairs = kb.preprocessing.SentencePairPreprocessor(tokenizer, 16, batch_size=4)
    cases = [(pre, strings, None, 3), (pre, strings.batch(3), None, 4),
             (pre, strings, 4, 3), (pre, strings.filter(lambda t: True), None, None),
             (grouped, strings, None, None), (blocks, strings, None, None),
             (pairs, strings, 4, None)]
    for preprocessor, ds, shuffle_batch_size, expected in cases:
        prepare = type(preprocessor).prepare
        type(preprocessor).prepare = None  # not called
        try:
            got = preprocessor.batches_per_epoch(ds, shuffle_batch_size=shuffle_batch_size)
        finally:
            type(preprocessor).prepare = prepare
        assert got == expected, (preprocessor.get_config(), ds, shuffle_batch_size)
        if preprocessor is blocks or preprocessor is pairs:
            continue
        batched = ds.batch(shuffle_batch_size) if shuffle_batch_size else ds
        length = int(preprocessor.prepare(batched).cardinality())
        assert got == (length if length > 0 else None)
    # What fit reads: an epoch of `prepare_epochs` (known length) has that many batches.
    epochs = tf.data.Dataset.from_tensors((tf.constant(1, tf.int64), tf.constant(0, tf.int64)))
    assert len(list(pre.prepare_epochs(strings, epochs, shuffle_batch_size=4))) == 3

    class Own(kb.preprocessing.MaskedLMPreprocessor):
        def prepare(self, ds, training=True):
            return super().prepare(ds, training).take(2)

    assert Own(tokenizer, 16, batch_size=4).batches_per_epoch(strings) == 2
    with pytest.raises(ValueError, match="no documents"):
        pre.batches_per_epoch(strings.take(0))
    with pytest.raises(TypeError, match="strings"):
        pairs.batches_per_epoch(tf.data.Dataset.from_tensor_slices([1, 2]))


def test_keras_hub_s_masking_and_truncation_arguments_are_taken(tokenizer, tmp_path):
    """keras-hub's `MaskedLMPreprocessor(..., mask_selection_rate=, mask_selection_length=,
    mask_token_rate=, random_token_rate=, truncate=)`, a keras-hub user's first script: Keras'
    "Unrecognized keyword arguments" (and the task's `from_preset` "unexpected keyword
    argument(s)"). They set the masker's (the default one, or the one a preprocessor or preset
    has), the number of predictions following the rate where it is the default one's."""
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 40, mask_selection_rate=0.3,
                                                mask_token_rate=0.9, random_token_rate=0.05)
    config = pre.masker.get_config()
    assert (config["mask_selection_rate"], config["mask_selection_length"]) == (0.3, 12)
    assert (config["mask_token_rate"], config["random_token_rate"]) == (0.9, 0.05)
    again = kb.preprocessing.MaskedLMPreprocessor.from_config(pre.get_config())
    assert again.masker.get_config() == config
    pre = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 40, mask_selection_length=5)
    assert pre.masker.mask_selection_length == 5 and pre.masker.mask_selection_rate == 0.15
    x, mask_ids, _ = pre(tf.constant(["a long sentence of many words " * 4]))
    assert mask_ids.shape == (1, 5)
    # a masker of another kind keeps its kind (ALBERT's n-grams, SpanBERT's spans)
    albert = kb.tasks.AlbertPretrainer.default_preprocessor(tokenizer, None, sequence_length=40,
                                                            mask_selection_rate=0.2)
    assert type(albert.masker).__name__ == "NgramMasker"
    assert (albert.masker.mask_selection_rate, albert.masker.mask_selection_length) == (0.2, 8)
    span = kb.preprocessing.SpanBertPreprocessor(tokenizer, 40, mask_token_rate=1.0,
                                                 random_token_rate=0.0)
    assert type(span.masker).__name__ == "SpanMasker" and span.masker.mask_token_rate == 1.0
    # truncate: as keras-hub's (the packer's), for one example a string
    waterfall = kb.preprocessing.MaskedLMPreprocessor(tokenizer, 8, truncate="waterfall",
                                                      mask_selection_rate=0.0)
    x, _, _ = waterfall((tf.constant(["a b c d e f"]), tf.constant(["g h"])))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert x["token_ids"].numpy()[0].tolist() == [cls, *tokenizer(["a b c d e"]).to_list()[0],
                                                  sep, sep]
    assert kb.preprocessing.MaskedLMPreprocessor.from_config(
        waterfall.get_config()).truncate == "waterfall"
    for kwargs, message in (
            (dict(truncate="longest"), r"truncate must be 'round_robin' or 'waterfall', got "
                                       r"'longest'"),
            (dict(truncate="waterfall", packing="token_blocks"),
             r"truncate='waterfall' is for packing='segments'.*'token_blocks'"),
            (dict(mask_selection_rate="0.3"), r"mask_selection_rate must be a number in \[0, 1\]"),
    ):
        with pytest.raises(ValueError, match=message):
            kb.preprocessing.MaskedLMPreprocessor(tokenizer, 16, **kwargs)
    with pytest.raises(ValueError, match=r"XLNetPreprocessor got mask_selection_rate=0.3: its "
                                         r"masker \(PermutationMasker\) takes"):
        kb.preprocessing.XLNetPreprocessor(tokenizer, 32, mask_selection_rate=0.3)

    # through a task's from_preset, also over a task preset's saved masker
    mlm = kb.tasks.MaskedLM.from_preset("bert_tiny_en_uncased", load_weights=False,
                                        sequence_length=16, mask_selection_rate=0.25,
                                        truncate="waterfall")
    assert mlm.preprocessor.masker.mask_selection_rate == 0.25
    assert mlm.preprocessor.masker.mask_selection_length == 4
    assert mlm.preprocessor.truncate == "waterfall"
    mlm.save_to_preset(str(tmp_path / "mlm"))
    again = kb.tasks.MaskedLM.from_preset(str(tmp_path / "mlm"), mask_selection_rate=0.5)
    assert again.preprocessor.masker.mask_selection_rate == 0.5
    assert again.preprocessor.masker.mask_selection_length == 8
    nsp = kb.tasks.BertPretrainer.from_preset("bert_tiny_en_uncased", load_weights=False,
                                              sequence_length=16, mask_token_rate=0.5)
    assert nsp.preprocessor.masker.mask_token_rate == 0.5


# === Model inputs of the family: no `segment_ids` where the backbone takes none ===
# A user's functional model over `backbone.input` (keras.io's "Getting Started", fine-tuning a
# custom model) given a dict with one key more than its inputs is matched BY POSITION by Keras
# (sorted keys, with a warning): `segment_ids` was read as `token_ids`, silently.
_MERGES = ["Ġ q", "u i", "c k", "ui ck", "Ġq uick", "Ġ f", "o x", "Ġf ox"]
_BPE = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "<unk>": 4, "a": 5, "Ġquick": 6, "Ġfox": 7}
for _part in [p for m in _MERGES for p in m.split()] + ["Ġq", "ui", "ck", "uick", "Ġf", "ox"]:
    _BPE.setdefault(_part, len(_BPE))
_WORDS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "a", "quick", "fox", "the", "film"]
_TINY = dict(num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=16)
_PAIRS = (tf.constant(["a quick fox", "the film"]), tf.constant(["a fox", "quick quick"]))


def _custom_model(backbone):
    """keras.io's custom model over a backbone's own inputs."""
    import keras

    h = backbone(backbone.input)["sequence_output"][:, 0]
    return keras.Model(backbone.input, keras.layers.Dense(2)(h))


def _check_feeds_a_custom_model(x, backbone):
    model = _custom_model(backbone)
    assert set(x) == set(backbone.input)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               model.predict({k: x[k] for k in backbone.input}, verbose=0))


def test_a_roberta_preprocessor_returns_roberta_s_inputs_as_keras_hub():
    """Attached to a RoBERTa task, or built with segment_ids=False: a byte-level BPE vocabulary
    alone is RoBERTa's or Longformer's (whose tasks read `segment_ids`): kept by default."""
    import keras_hub

    tokenizer = kb.preprocessing.BytePairTokenizer(_BPE, _MERGES)
    backbone = kb.models.RobertaBackbone(vocabulary_size=len(_BPE), **_TINY)
    pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12)
    assert "segment_ids" in pre(_PAIRS)
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre)
    assert set(pre(_PAIRS)) == {"token_ids", "padding_mask"}
    pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12,
                                                      segment_ids=False)
    x = pre(_PAIRS)
    theirs = keras_hub.models.RobertaTextClassifierPreprocessor(
        keras_hub.models.RobertaTokenizer(vocabulary=_BPE, merges=_MERGES), sequence_length=12)
    assert set(x) == set(theirs(x=_PAIRS)) == {"token_ids", "padding_mask"}
    _check_feeds_a_custom_model(x, backbone)
    mlm = kb.preprocessing.MaskedLMPreprocessor(tokenizer, sequence_length=12, seed=0)
    assert "segment_ids" in mlm(_PAIRS[0])[0]
    kb.tasks.MaskedLM(backbone, preprocessor=mlm)
    theirs = keras_hub.models.RobertaMaskedLMPreprocessor(
        keras_hub.models.RobertaTokenizer(vocabulary=_BPE, merges=_MERGES), sequence_length=12)
    assert set(mlm(_PAIRS[0])[0]) == set(theirs(_PAIRS[0])[0]) == {
        "token_ids", "padding_mask", "mask_positions"}


def _family_preset(tmp_path, backbone_cls, tokenizer):
    config = {k: v for k, v in _TINY.items()
              if k != "max_sequence_length" or backbone_cls is not kb.models.XLNetBackbone}
    if backbone_cls is kb.models.AlbertBackbone:
        config["embedding_dim"] = 8
    backbone = backbone_cls(vocabulary_size=tokenizer.vocabulary_size(), **config)
    pre = kb.preprocessing.TextClassifierPreprocessor(tokenizer, sequence_length=12)
    path = str(tmp_path / backbone_cls.__name__)
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre).save_to_preset(path)
    return path, backbone


def test_a_preset_preprocessor_returns_its_backbone_s_inputs(tmp_path):
    """DistilBERT's WordPiece vocabulary is BERT's: the preset's backbone says which inputs."""
    import keras
    import keras_hub

    words = kb.preprocessing.WordPieceTokenizer(_WORDS)
    path, backbone = _family_preset(tmp_path, kb.models.DistilBertBackbone, words)
    pre = kb.preprocessing.TextClassifierPreprocessor.from_preset(path, sequence_length=12)
    x = pre(_PAIRS)
    theirs = keras_hub.models.DistilBertTextClassifierPreprocessor(
        keras_hub.models.DistilBertTokenizer(vocabulary=_WORDS), sequence_length=12)
    assert set(x) == set(theirs(x=_PAIRS)) == {"token_ids", "padding_mask"}
    _check_feeds_a_custom_model(x, backbone)
    mlm = kb.preprocessing.MaskedLMPreprocessor.from_preset(path, sequence_length=12, seed=0)
    theirs = keras_hub.models.DistilBertMaskedLMPreprocessor(
        keras_hub.models.DistilBertTokenizer(vocabulary=_WORDS), sequence_length=12)
    assert set(mlm(_PAIRS[0])[0]) == set(theirs(_PAIRS[0])[0])
    # the same preprocessors from their config (the tokenizer's vocabulary is an asset) and
    # from a .keras file
    config = dict(pre.get_config(), tokenizer=pre.tokenizer)
    assert config["segment_ids"] is False
    assert set(type(pre)(**config)(_PAIRS)) == {"token_ids", "padding_mask"}
    config = dict(mlm.get_config(), tokenizer=mlm.tokenizer)
    assert config["segment_ids"] is False
    assert set(type(mlm)(**config)(_PAIRS[0])[0]) == set(mlm(_PAIRS[0])[0])
    kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=pre).save(
        str(tmp_path / "clf.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "clf.keras")).preprocessor
    assert set(loaded(_PAIRS)) == {"token_ids", "padding_mask"}
    for cls, tok in ((kb.models.RobertaBackbone, kb.preprocessing.BytePairTokenizer(_BPE, _MERGES)),
                     (kb.models.BertBackbone, words), (kb.models.AlbertBackbone, words),
                     (kb.models.XLNetBackbone, words)):
        path, backbone = _family_preset(tmp_path, cls, tok)
        x = kb.preprocessing.TextClassifierPreprocessor.from_preset(path, sequence_length=12)(
            _PAIRS)
        assert set(x) == set(backbone.input), cls.__name__


def test_a_task_s_preprocessor_returns_its_backbone_s_inputs():
    """A preprocessor attached to a task returns the inputs of the task's backbone; one asked
    for no `segment_ids` is refused by a backbone that reads them."""
    words = kb.preprocessing.WordPieceTokenizer(_WORDS)
    distil = kb.models.DistilBertBackbone(vocabulary_size=len(_WORDS), **_TINY)
    pre = kb.preprocessing.TextClassifierPreprocessor(words, sequence_length=12)
    assert "segment_ids" in pre(_PAIRS)
    task = kb.tasks.TextClassifier(distil, num_classes=2, preprocessor=pre)
    assert set(task.preprocessor(_PAIRS)) == {"token_ids", "padding_mask"}
    bpe = kb.preprocessing.BytePairTokenizer(_BPE, _MERGES)
    longformer = kb.models.LongformerBackbone(vocabulary_size=len(_BPE), attention_window=4,
                                              **_TINY)
    pre = kb.preprocessing.TextClassifierPreprocessor(bpe, sequence_length=12)
    kb.tasks.TextClassifier(longformer, num_classes=2, preprocessor=pre)
    assert "segment_ids" in pre(_PAIRS)  # Longformer's tasks read them
    bert = kb.models.BertBackbone(vocabulary_size=len(_WORDS), **_TINY)
    pre = kb.preprocessing.TextClassifierPreprocessor(words, sequence_length=12, segment_ids=False)
    with pytest.raises(ValueError, match=r"BertBackbone reads `segment_ids`.*segment_ids=False"):
        kb.tasks.TextClassifier(bert, num_classes=2, preprocessor=pre)
    with pytest.raises(ValueError, match=r"segment_ids must be 'auto', True or False, got 1"):
        kb.preprocessing.TextClassifierPreprocessor(words, segment_ids=1)
