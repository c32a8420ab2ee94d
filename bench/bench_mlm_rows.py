"""The MaskedLM train step at BERT-Mini (L4 / H256 / A4 / I1024, vocabulary 30522, dropout 0.1,
batch 16 x 128, 20 prediction slots a row, 19 of them weighted), TensorFlow, batches in memory,
the task's default `compile`: the step time with the last layer at the masked rows only
(`masked_rows_only=True`, the default) against the whole last layer (`False`), and where the
step's time goes (tf.profiler's per-op time).

- `--task spanbert`: SpanBertPretrainer's step instead (MLM + SBO; SpanBERT's backbone, the same
  sizes): each row's 20 slots are 5 spans of 4 tokens, the last slot a padding one (position 0,
  weight 0), span boundaries from `span_boundaries`; its rows-only last layer computes the
  masked rows and the spans' boundaries s-1, e+1 (3P rows, + [CLS]).

- `--rounds R`: R interleaved rounds, each `--steps` steps of every variant in turn (load falls
  alike on both); medians of the per-round mean step times (wall, and the process's CPU time,
  less moved by other processes' load) and of the paired ratios, the load average printed.
- `--profile`: tf.profiler over `--steps` steps of each variant, its op time summed by op type
  (ops overlap on TensorFlow's two inter-op threads: the sum exceeds the wall time).

Matmul FLOPs a step (multiply-add = 2, forward + both backward products = 3 x forward):
    encoder weights   6 * L * (4 H^2 + 2 H I) * B * T           (full last layer)
    attention         3 * 4 * L * B * T^2 * H                    (QK^T and PV)
    MLM head          6 * B * P * (H * H + H * V)                (transform + tied projection)
    SBO head (spanbert)  6 * B * P * ((2 H + D) * H + H * H + H * V)  (D = 200, tied projection)
With the masked rows only, the last layer's queries, output projection, feed-forward and its
attention rows run on B * (P + 1) rows (SpanBERT: B * (3 P + 1)) instead of B * T (keys and
values still on B * T).

Usage: python bench/bench_mlm_rows.py [--task mlm|spanbert] [--rounds 6] [--steps 8] [--profile]
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
SPANS, SPAN_LENGTH, SBO_D = 5, 4, 200  # --task spanbert: 5 spans of 4 tokens = P slots


def batch(seed=0, task="mlm"):
    if task == "spanbert":
        return span_batch(seed)
    rng = np.random.RandomState(seed)
    x = {"token_ids": rng.randint(1000, V, (B, T)).astype("int32"),
         "segment_ids": np.zeros((B, T), "int32"),
         "padding_mask": np.ones((B, T), "int32"),
         "mask_positions": np.sort(np.stack([rng.choice(np.arange(1, T - 1), P, replace=False)
                                             for _ in range(B)]), axis=1).astype("int32")}
    y = rng.randint(1000, V, (B, P)).astype("int32")
    w = (np.arange(P)[None] < WEIGHTED).astype("float32").repeat(B, 0)
    return x, y, w


def span_batch(seed=0):
    """`batch`'s rows with each row's slots in spans: 5 spans of 4 tokens, in disjoint blocks
    of 24 tokens (unmasked tokens between them), the last slot padding."""
    from keras_bertfam.preprocessing.masking import span_boundaries

    x, y, w = batch(seed)
    rng = np.random.RandomState(seed + 1)
    blocks = (T - 2) // SPANS
    starts = np.stack([1 + np.arange(SPANS) * blocks
                       + rng.randint(1, blocks - SPAN_LENGTH, SPANS) for _ in range(B)])
    positions = (starts[:, :, None] + np.arange(SPAN_LENGTH)).reshape(B, P).astype("int32")
    positions[:, WEIGHTED:] = 0
    span_starts, span_ends = (v.numpy() for v in span_boundaries(positions, w))
    return dict(x, mask_positions=positions, span_starts=span_starts, span_ends=span_ends), y, w


def make(rows_only, x, y, w, task_name="mlm"):
    keras.utils.set_random_seed(0)
    kwargs = {} if rows_only is None else {"masked_rows_only": rows_only}
    if task_name == "spanbert":
        backbone = kb.models.SpanBertBackbone(V, L, N, H, I, dropout=0.1,
                                              max_sequence_length=512)
        task = kb.tasks.SpanBertPretrainer(backbone, position_embedding_dim=SBO_D, **kwargs)
    else:
        backbone = kb.models.BertBackbone(V, L, N, H, I, dropout=0.1, max_sequence_length=512)
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


def flops(rows_only, task="mlm"):
    full_layer = 6 * (4 * H * H + 2 * H * I) * B * T + 3 * 4 * B * T * T * H
    last = full_layer
    spanbert = task == "spanbert"
    if rows_only:
        q = B * ((3 * P if spanbert else P) + 1)
        last = 6 * (2 * H * H) * B * T + 6 * (2 * H * H + 2 * H * I) * q + 3 * 4 * q * T * H
    head = 6 * B * P * (H * H + H * V)
    if spanbert:
        head += 6 * B * P * ((2 * H + SBO_D) * H + H * H + H * V)
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
    parser.add_argument("--task", choices=("mlm", "spanbert"), default="mlm",
                        help="MaskedLM's step, or SpanBertPretrainer's (MLM + SBO)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", choices=("default",), default=None,
                        help="one variant: the task's default (before the option existed)")
    args = parser.parse_args()
    data = batch(task=args.task)
    variants = ({"default": None} if args.only else {"rows_only": True, "full": False})
    tasks = {name: make(value, *data, task_name=args.task) for name, value in variants.items()}
    print(f"load average {os.getloadavg()}, TF {tf.__version__}, Keras {keras.__version__}")
    for name in tasks:
        total, head = flops(variants[name] is not False, args.task)
        print(f"{name} ({args.task}): matmul FLOPs a step {total / 1e9:.2f} G (heads "
              f"{head / 1e9:.2f} G)")
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
        total, _ = flops(variants[name] is not False, args.task)
        wall, cpu = np.median(np.array(times[name]), axis=0)
        print(f"{name}: median step {1e3 * wall:.1f} ms (CPU {1e3 * cpu:.1f} ms), "
              f"{total / wall / 1e9:.0f} GFLOP/s matmul")
    if len(tasks) == 2:
        ratio = np.median(np.array(times["full"]) / np.array(times["rows_only"]), axis=0)
        print(f"median paired ratio full / rows_only: wall {ratio[0]:.3f}, CPU {ratio[1]:.3f}; "
              f"FLOPs {flops(False, args.task)[0] / flops(True, args.task)[0]:.3f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
