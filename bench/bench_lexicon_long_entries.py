"""CPU time of `EntityMasker` with gazetteer entries far longer than the rows, the rows' length
static or unknown at trace time (`[None, None]`: ragged or unpadded rows).

Setup: a 300-id vocabulary; a gazetteer of 200 names of 2-4 ids, plus (`--long`) names of 64 to
`--longest` ids that can never match rows of `--length`; batches of `--batch` rows of random
words in which the short names occur. Each variant is one `tf.function` of the masker's call
(fixed call seed): ours with the short gazetteer only, and with the long names, under a static
and an unknown row length; with `--baseline`, the same from another masking.py (e.g. `git show
REV:keras_bertfam/preprocessing/masking.py > /tmp/old_masking.py`). The variants run in
interleaved rounds (`--rounds`, `--calls` each); reported: the process CPU time per batch
(user + system, all threads), median over the rounds. Every variant's masks must be identical.

Usage: python bench/bench_lexicon_long_entries.py [--baseline /tmp/old_masking.py]
       [--length 32] [--batch 32] [--long 200] [--longest 512] [--rounds 7] [--calls 20]
Not a test: numbers depend on the machine and its load.
"""
import argparse
import os
import resource
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from bench_masking import load_baseline  # noqa: E402
from keras_bertfam.preprocessing import masking as M  # noqa: E402

VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(4, 300)]


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default=None, help="another masking.py, timed alongside")
    parser.add_argument("--length", type=int, default=32, help="tokens per row")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--long", type=int, default=200, help="names longer than the rows")
    parser.add_argument("--longest", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="batches per variant and round")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    short = [rng.integers(4, 60, size=rng.integers(2, 5)).tolist() for _ in range(200)]
    long = [rng.integers(4, 60, size=rng.integers(64, args.longest + 1)).tolist()
            for _ in range(args.long)]
    rows = rng.integers(4, 60, size=(args.batch, args.length)).astype(np.int32)
    rows[:, 0], rows[:, -1] = 1, 2
    ids = tf.constant(rows)
    modules = [("ours", M)]
    if args.baseline:
        modules.append(("baseline", load_baseline(args.baseline)))
    kw = dict(vocabulary=VOCAB, unselectable_token_ids=(0, 1, 2), seed=1)
    shapes = {"static": [None, args.length], "unknown": [None, None]}
    variants = {}
    for tag, module in modules:
        for names, gazetteer in (("short names", short), ("+ long names", short + long)):
            masker = module.EntityMasker(entities=gazetteer, **kw)
            for shape, spec in shapes.items():
                if names == "short names" and shape == "static":
                    continue
                variants[f"{tag:8s} {names:12s} {shape} length"] = tf.function(
                    lambda x, m=masker: m(x, seed=7),
                    input_signature=[tf.TensorSpec(spec, tf.int32)])
    reference = None
    for name, fn in variants.items():  # traced, warmed up, and the same masks
        out = {k: v.numpy() for k, v in fn(ids).items()}
        reference = reference or out
        for k in out:
            np.testing.assert_array_equal(out[k], reference[k], err_msg=f"{name}: {k}")
    print(f"rows {args.batch} x {args.length}; gazetteer {len(short)} names of 2-4 ids + "
          f"{len(long)} of 64-{args.longest}; tf {tf.__version__}, {os.cpu_count()} cpus, load "
          f"average {os.getloadavg()[0]:.1f}; masks identical in every variant")
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            start = cpu_seconds()
            for _ in range(args.calls):
                fn(ids)["mask_positions"].numpy()
            times[name].append((cpu_seconds() - start) / args.calls * 1e3)
    for name, t in times.items():
        print(f"{name}: {np.median(t):7.2f} ms CPU per batch (rounds {min(t):.2f}-"
              f"{max(t):.2f})")


if __name__ == "__main__":
    main()
