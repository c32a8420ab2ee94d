"""Peak memory and CPU time of a MaskedLM train step on TensorFlow, one fresh process per run.

`kb.tasks.MaskedLM(kb.models.BertBackbone(...))` with `compile()`'s defaults, `train_on_batch`
on one fixed batch (16 x 128, 20 masked positions per row, keras-hub's preprocessed format),
`--steps` times. Prints one JSON line: RSS after imports and after building, the process's peak
RSS (`ru_maxrss`) after each step, each step's CPU time (user + system) and wall time, the
losses, the load average. Peaks move by ~50-150 MB from run to run (the allocator): compare
variants in fresh processes, interleaved, several rounds, e.g.

    for r in 1 2 3; do for d in keras redrawn; do
        python bench/bench_step_memory.py --config base --dropout-impl $d; done; done

`--dropout-impl` swaps the backend dropout every Dropout layer calls (an experiment, through
Keras' private backend module), the same seed draws in each:

- keras: Keras' own (`tf.nn.experimental.stateless_dropout`: `where(keep, x * scale, 0)`, whose
  gradient reads the bool `keep` mask);
- redrawn: the same output, the gradient drawing `keep` again from the seed (no mask kept);
- float_mask: `x * scale * cast(keep, float)` (TF's dropout before `where`: a float mask kept);
- none_kept: dropout returns its input (nothing kept, nothing dropped: the floor any dropout
  implementation can reach, with the same attention path as dropout > 0).

`--allocator-peak` runs TensorFlow's CPU tensors through its BFC allocator
(`TF_CPU_ALLOCATOR_USE_BFC=true`) and adds `tf_peak_mb`: the most bytes of tensors alive at
once during each step (`tf.config.experimental.get_memory_info`, reset before each step), and
`tf_held_mb`, those alive between steps (weights, optimizer slots). Unlike the RSS these do not
depend on glibc's allocator: the same to ~1 MB from run to run, so one run per variant tells
what a change removed from the step's peak. The RSS in that mode is the BFC allocator's.

Usage: python bench/bench_step_memory.py [--config base|mini|tiny] [--dropout 0.1] [--steps 4]
       [--dropout-impl keras|redrawn|float_mask|none_kept] [--allocator-peak]
"""
import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "base": dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072),
    "mini": dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024),
    "tiny": dict(num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512),
}
B, T, P, V = 16, 128, 20, 30522


def fixed_batch_and_task(config, dropout):
    """The bench's fixed batch (B x T ids, P masked positions a row; keras-hub's preprocessed
    format) and a compiled `MaskedLM` of `config` (also bench/kept_tensors.py's)."""
    import keras
    import numpy as np

    import keras_bertfam as kb

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, V, (B, T)).astype("int32")
    positions = np.sort(np.stack([rng.choice(np.arange(1, T - 1), P, replace=False)
                                  for _ in range(B)]), 1).astype("int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids),
         "mask_positions": positions}
    y, w = np.take_along_axis(ids, positions, 1), np.ones(positions.shape, "float32")
    keras.utils.set_random_seed(0)
    task = kb.tasks.MaskedLM(kb.models.BertBackbone(
        V, dropout=dropout, max_sequence_length=512, **CONFIGS[config]), preprocessor=None)
    task.compile()
    return (x, y, w), task


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def swap_dropout(impl):
    import keras.src.backend as backend
    import tensorflow as tf
    from keras.src.backend.tensorflow.random import _cast_seed, draw_seed

    def dropout(inputs, rate, noise_shape=None, seed=None):
        if rate == 0.0 or impl == "none_kept":
            return inputs
        seed = _cast_seed(draw_seed(seed))  # Keras' own draw

        def drop(x):
            return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed,
                                                        noise_shape=noise_shape)

        if impl == "redrawn":
            @tf.custom_gradient
            def redrawn(x):
                return drop(tf.stop_gradient(x)), drop  # d/dx: dropout of the upstream

            return redrawn(inputs)
        keep = tf.random.stateless_uniform(tf.shape(inputs), seed, dtype=inputs.dtype) >= rate
        return inputs * (1 / (1 - rate)) * tf.cast(keep, inputs.dtype)

    backend.random.dropout = dropout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="base")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dropout-impl", default="keras",
                        choices=["keras", "redrawn", "float_mask", "none_kept"])
    parser.add_argument("--allocator-peak", action="store_true")
    args = parser.parse_args()
    if args.allocator_peak:
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.join(HERE, ".."))
    import keras  # noqa: F401 - the imports' RSS is measured before the task is built
    import numpy as np

    import keras_bertfam  # noqa: F401

    if args.dropout_impl != "keras":
        swap_dropout(args.dropout_impl)
    imports = rss_mb()
    (x, y, w), task = fixed_batch_and_task(args.config, args.dropout)
    built = rss_mb()
    cpu, wall, losses, peaks, tf_peaks, tf_held = [], [], [], [], [], []
    if args.allocator_peak:
        import tensorflow as tf
    for _ in range(args.steps):
        if args.allocator_peak:
            tf_held.append(round(tf.config.experimental.get_memory_info("CPU:0")["current"] / 2**20))
            tf.config.experimental.reset_memory_stats("CPU:0")
        c, t = cpu_seconds(), time.perf_counter()
        loss = task.train_on_batch(x, y, sample_weight=w)
        cpu.append(round(cpu_seconds() - c, 3))
        wall.append(round(time.perf_counter() - t, 3))
        losses.append(float(np.asarray(loss).ravel()[0]))
        peaks.append(round(peak_mb()))
        if args.allocator_peak:
            tf_peaks.append(round(tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20))
    print(json.dumps(dict(config=args.config, dropout=args.dropout, impl=args.dropout_impl,
                          imports_mb=round(imports), built_mb=round(built), peak_mb=peaks[-1],
                          step_peaks_mb=peaks, step_cpu_s=cpu, step_wall_s=wall, loss=losses,
                          load=os.getloadavg()[0],
                          **(dict(tf_peak_mb=tf_peaks, tf_held_mb=tf_held)
                             if args.allocator_peak else {}))))


if __name__ == "__main__":
    main()
