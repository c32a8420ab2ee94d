"""The pieces of a BERT-base train step that #15's model-step experiments asked about, timed at
BERT-base's shapes (batch 16 x 128 tokens, H 768, 12 heads, intermediate 3072) on TensorFlow:

- QKV: three [2048, 768] x [768, 768] projections vs one fused [768, 2304] kernel (stored fused,
  or concatenated from the three at each step), forward + backward;
- the same three projections + exact GELU under XLA (`jit_compile=True`) vs without;
- exact (erf) vs tanh-approximate GELU on the [2048, 3072] intermediate, forward + backward;
- dropout (rate 0.1) on the attention probabilities [16, 12, 128, 128] and on a hidden state
  [2048, 768], against drawing the random bits alone.

Each is a `tf.function`; after warm-up, `--rounds` rounds run every variant in turn (machine load
falls alike on each) and the medians are printed with the load average. A BERT-base step runs 12
layers of each (a ~5 s step on 2 cores: see bench_pretrain_e2e.py).

Usage: python bench/bench_model_step_parts.py [--rounds 15]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

T, H, I, N, B, L = 2048, 768, 3072, 12, 16, 128


def variants():
    x = tf.random.normal([T, H])
    w = [tf.Variable(tf.random.normal([H, H]) * 0.02) for _ in range(3)]
    w_fused = tf.Variable(tf.concat(w, 1))
    h = tf.random.normal([T, I])
    probs = tf.random.uniform([B, N, L, L])
    hidden = tf.random.normal([T, H])
    seed = tf.constant([1, 2])

    def grads(f, sources):
        def step():
            with tf.GradientTape() as tape:
                tape.watch(x)
                tape.watch(h)
                loss = f()
            return tape.gradient(loss, sources)
        return step

    def separate():
        return tf.add_n([tf.reduce_sum(tf.matmul(x, v)) for v in w])

    def separate_gelu():
        return tf.add_n([tf.reduce_sum(tf.nn.gelu(tf.matmul(x, v))) for v in w])

    def split_sum(y):
        return tf.add_n([tf.reduce_sum(part) for part in tf.split(y, 3, axis=1)])

    out = {
        "qkv separate": tf.function(grads(separate, [x] + w)),
        "qkv fused kernel": tf.function(grads(lambda: split_sum(tf.matmul(x, w_fused)),
                                              [x, w_fused])),
        "qkv concat per step": tf.function(grads(lambda: split_sum(tf.matmul(x, tf.concat(w, 1))),
                                                 [x] + w)),
        "qkv+gelu": tf.function(grads(separate_gelu, [x] + w)),
        "qkv+gelu XLA": tf.function(grads(separate_gelu, [x] + w), jit_compile=True),
        "gelu erf": tf.function(grads(lambda: tf.reduce_sum(tf.nn.gelu(h, approximate=False)),
                                      [h])),
        "gelu tanh": tf.function(grads(lambda: tf.reduce_sum(tf.nn.gelu(h, approximate=True)),
                                       [h])),
        "dropout probs": tf.function(
            lambda: tf.nn.experimental.stateless_dropout(probs, 0.1, seed)),
        "uniform bits probs": tf.function(
            lambda: tf.random.stateless_uniform(tf.shape(probs), seed, dtype=tf.float32)),
        "dropout hidden": tf.function(
            lambda: tf.nn.experimental.stateless_dropout(hidden, 0.1, seed)),
    }
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    fns = variants()
    for f in fns.values():
        f()
        f()
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, f in fns.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    for name, t in times.items():
        print(f"{name:22s} {np.median(t) * 1e3:8.2f} ms")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
