"""The MaskedLM train step at BERT-Mini (L4 / H256 / A4 / I1024, vocabulary 30522, dropout 0.1,
batch 16 x 128, 20 prediction slots a row, 19 of them weighted), TensorFlow, batches in memory,
the task's default `compile`: the step time with the last layer at the masked rows only
(`masked_rows_only=True`, the default) against the whole last layer (`False`), and where the
step's time goes (tf.profiler's per-op time).

- `--rounds R`: R interleaved rounds, each `--steps` steps of every variant in turn (load falls
  alike on both); medians of the per-round mean step times (wall, and the process's CPU time,
  less moved by other processes' load) and of the paired ratios, the load average printed.
- `--profile`: tf.profiler over `--steps` steps of each variant, its op time summed by op type
  (ops overlap on TensorFlow's two inter-op threads: the sum exceeds the wall time).

Matmul FLOPs a step (multiply-add = 2, forward + both backward products = 3 x forward):
    encoder weights   6 * L * (4 H^2 + 2 H I) * B * T           (full last layer)
    attention         3 * 4 * L * B * T^2 * H                    (QK^T and PV)
    MLM head          6 * B * P * (H * H + H * V)                (transform + tied projection)
With the masked rows only, the last layer's queries, output projection, feed-forward and its
attention rows run on B * (P + 1) rows instead of B * T (keys and values still on B * T).

Usage: python bench/bench_mlm_rows.py [--rounds 6] [--steps 8] [--profile]
Not a test: numbers depend on the machine and its load.
"""
import argparse
import collections
import glob
import os
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_bertfam as kb  # noqa: E402

L, H, N, I, V = 4, 256, 4, 1024, 30522
B, T, P, WEIGHTED = 16, 128, 20, 19


def batch(seed=0):
    rng = np.random.RandomState(seed)
    x = {"token_ids": rng.randint(1000, V, (B, T)).astype("int32"),
         "segment_ids": np.zeros((B, T), "int32"),
         "padding_mask": np.ones((B, T), "int32"),
         "mask_positions": np.sort(np.stack([rng.choice(np.arange(1, T - 1), P, replace=False)
                                             for _ in range(B)]), axis=1).astype("int32")}
    y = rng.randint(1000, V, (B, P)).astype("int32")
    w = (np.arange(P)[None] < WEIGHTED).astype("float32").repeat(B, 0)
    return x, y, w


def make(rows_only, x, y, w):
    keras.utils.set_random_seed(0)
    backbone = kb.models.BertBackbone(V, L, N, H, I, dropout=0.1, max_sequence_length=512)
    kwargs = {} if rows_only is None else {"masked_rows_only": rows_only}
    task = kb.tasks.MaskedLM(backbone, **kwargs)
    task.compile()
    for _ in range(3):  # trace + warm-up
        task.train_on_batch(x, y, sample_weight=w)
    return task


def steps(task, data, n):
    """Mean wall and process CPU time (every thread) of n steps."""
    x, y, w = data
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        task.train_on_batch(x, y, sample_weight=w)
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def flops(rows_only):
    full_layer = 6 * (4 * H * H + 2 * H * I) * B * T + 3 * 4 * B * T * T * H
    last = full_layer
    if rows_only:
        q = B * (P + 1)
        last = 6 * (2 * H * H) * B * T + 6 * (2 * H * H + 2 * H * I) * q + 3 * 4 * q * T * H
    head = 6 * B * P * (H * H + H * V)
    return (L - 1) * full_layer + last + head, head


def profile(task, data, n):
    logdir = tempfile.mkdtemp(prefix="mlmrows_prof_")
    tf.profiler.experimental.start(logdir)
    steps(task, data, n)
    tf.profiler.experimental.stop()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type = collections.Counter()
    by_name = collections.Counter()
    calls = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # the executor's threads
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                if ":" not in name or "::" in name:  # ops are "name:Type"
                    continue
                op_type = name.rsplit(":", 1)[1]
                by_type[op_type] += event.duration_ps / 1e9  # ms
                by_name[name] += event.duration_ps / 1e9
                calls[op_type] += 1
    total = sum(by_type.values())
    print(f"  op time a step {total / n:.1f} ms (summed over threads); by op type:")
    for op_type, ms in by_type.most_common(22):
        print(f"    {op_type:40s} {ms / n:7.2f} ms  {calls[op_type] / n:6.1f} calls  "
              f"{100 * ms / total:5.1f}%")
    print("  the biggest single ops:")
    for name, ms in by_name.most_common(12):
        print(f"    {name[-100:]:100s} {ms / n:7.2f} ms")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", choices=("default",), default=None,
                        help="one variant: the task's default (before the option existed)")
    args = parser.parse_args()
    data = batch()
    variants = ({"default": None} if args.only else {"rows_only": True, "full": False})
    tasks = {name: make(value, *data) for name, value in variants.items()}
    print(f"load average {os.getloadavg()}, TF {tf.__version__}, Keras {keras.__version__}")
    for name in tasks:
        total, head = flops(variants[name] is not False)
        print(f"{name}: matmul FLOPs a step {total / 1e9:.2f} G (MLM head {head / 1e9:.2f} G)")
    if args.profile:
        for name, task in tasks.items():
            print(f"profile of {name} ({args.steps} steps):")
            profile(task, data, args.steps)
        return
    times = collections.defaultdict(list)
    for r in range(args.rounds):
        order = list(tasks) if r % 2 == 0 else list(tasks)[::-1]
        for name in order:
            times[name].append(steps(tasks[name], data, args.steps))
        print(f"round {r}: " + ", ".join(f"{n} {1e3 * times[n][-1][0]:.1f} ms (CPU "
                                         f"{1e3 * times[n][-1][1]:.1f})" for n in tasks)
              + f"  load {os.getloadavg()[0]:.2f}", flush=True)
    for name in tasks:
        total, _ = flops(variants[name] is not False)
        wall, cpu = np.median(np.array(times[name]), axis=0)
        print(f"{name}: median step {1e3 * wall:.1f} ms (CPU {1e3 * cpu:.1f} ms), "
              f"{total / wall / 1e9:.0f} GFLOP/s matmul")
    if len(tasks) == 2:
        ratio = np.median(np.array(times["full"]) / np.array(times["rows_only"]), axis=0)
        print(f"median paired ratio full / rows_only: wall {ratio[0]:.3f}, CPU {ratio[1]:.3f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
