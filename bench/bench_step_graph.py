"""The fine-tuning train step's graph and time: MiniLM `TextClassifier` (`all_minilm_l6_v2`,
2 classes, the task's default compile: AdamW, global clipnorm 1, dropout 0.1), TensorFlow.

`--count`: the ops of the traced train step (`train_step` under `tf.function`, batch and length
unknown, as `fit` with dynamic padding traces it), by type and by the layer that made them
(name scopes; the written-out gradients' ops have no layer scope: "(top)"), and an encoder
block's forward and backward (`block_1`); with `--keras-hub`, keras-hub's `BertBackbone` block
at MiniLM's size traced the same way (a yardstick: its forward and backward under tf.GradientTape
of the sum of its output).

`--time`: the step's CPU and wall at batch 32 x T (T = 16 and 32), every `--rounds` round a
fresh process per variant, variants alternating (`--variants LABEL=PYTHONPATH ...`; each
process: its first step, which traces, then `--steps` steps at each T in turn, the medians
and the least CPU), the first step's CPU (tracing the step, its first run) and the least CPU of
3 more traces of the step (tracing alone; the least is the least disturbed by other load). A variant may
set TensorFlow's threads: `LABEL=PATH@INTER,INTRA`.

Usage: python bench/bench_step_graph.py --count [--keras-hub]
       python bench/bench_step_graph.py --time --variants main=/tmp/main new=. [--rounds 3]
Not a test: numbers depend on the machine and its load (printed).
"""
import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ops(graph):
    ops = list(graph.get_operations())
    for function in graph._functions.values():
        ops += list(function.graph.get_operations())
    return ops


def _classifier():
    import keras

    import keras_bertfam as kb

    keras.utils.set_random_seed(0)
    clf = kb.tasks.TextClassifier.from_preset("all_minilm_l6_v2", num_classes=2)
    clf.preprocessor = None
    clf.compile(learning_rate=5e-5)
    return clf


def _batch(b, t, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(1000, 5000, (b, t)).astype("int32"),
         "segment_ids": np.zeros((b, t), "int32"),
         "padding_mask": np.ones((b, t), "int32")}
    x["padding_mask"][: b // 2, t * 3 // 4:] = 0
    return x, rng.integers(0, 2, (b,)).astype("int32")


def _spec():
    import tensorflow as tf

    return ({k: tf.TensorSpec([None, None], tf.int32)
             for k in ("token_ids", "segment_ids", "padding_mask")},
            tf.TensorSpec([None], tf.int32))


def _scope(name):
    """The part of the step an op belongs to, by its name scope."""
    parts = [p for p in name.split("/")[:-1] if p != "gradient_tape"]
    if parts and parts[0].startswith("adam"):
        return "optimizer"
    if any(p.startswith(("block_", "transformer_layer")) for p in parts):
        return "encoder blocks"
    for p in reversed(parts):
        if p.split("_")[0] in ("embeddings", "head", "logits", "pooler"):
            return p.rsplit("_", 1)[0] if p[-1].isdigit() else p
    return "(top)"


def count(keras_hub):
    import tensorflow as tf

    clf = _classifier()
    x, y = _batch(32, 16)
    clf.train_on_batch(x, y)  # builds the optimizer's slots, as fit does before tracing
    step = tf.function(clf.train_step)
    start = _cpu()
    graph = step.get_concrete_function(_spec()).graph
    traced = _cpu() - start
    ops = _ops(graph)
    print(f"train step: {len(ops)} ops ({sum(o.type == 'Const' for o in ops)} Const, "
          f"{sum(o.type == 'Placeholder' for o in ops)} Placeholder: captured variables); "
          f"traced in {traced:.1f} s CPU")
    print("  by type:", collections.Counter(o.type for o in ops).most_common(20))
    print("  by part:", collections.Counter(_scope(o.name) for o in ops).most_common())
    block = [o for o in ops if "/block_1" in o.name]
    backward = [o for o in block if o.name.startswith("gradient_tape")]
    print(f"  block_1: forward {len(block) - len(backward)} ops, backward {len(backward)} ops "
          f"in its scope (the written-out gradients' ops are in (top))")
    if keras_hub:
        import keras_hub

        backbone = keras_hub.models.BertBackbone(30522, 6, 12, 384, 1536, dropout=0.1)

        @tf.function
        def hub_step(token_ids, segment_ids, padding_mask):
            with tf.GradientTape() as tape:
                out = backbone({"token_ids": token_ids, "segment_ids": segment_ids,
                                "padding_mask": padding_mask}, training=True)
                loss = tf.reduce_sum(out["pooled_output"])
            return tape.gradient(loss, backbone.trainable_variables)

        spec = tf.TensorSpec([None, None], tf.int32)
        hops = _ops(hub_step.get_concrete_function(spec, spec, spec).graph)
        hblock = [o for o in hops if "transformer_layer_1" in o.name]
        hback = [o for o in hblock if o.name.startswith("gradient_tape")]
        print(f"keras-hub BertBackbone (6 x 384) fwd + bwd: {len(hops)} ops; transformer_layer_1: "
              f"forward {len(hblock) - len(hback)}, backward {len(hback)}")
        print("  by type:", collections.Counter(o.type for o in hblock).most_common(12))
        print("  by part:", collections.Counter(_scope(o.name) for o in hops).most_common())


def worker(steps, threads):
    import tensorflow as tf

    if threads:
        inter, intra = threads
        tf.config.threading.set_inter_op_parallelism_threads(inter)
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    clf = _classifier()
    x, y = _batch(32, 16)
    clf.train_on_batch(x, y)  # eager build: slots made before the step is traced
    step = tf.function(clf.train_step, input_signature=[_spec()])
    start, wall = _cpu(), time.perf_counter()
    step((x, y))
    first = (_cpu() - start, time.perf_counter() - wall)
    result = {"first_cpu": first[0], "first_wall": first[1]}
    batches = {t: _batch(32, t, seed=t) for t in (16, 32)}
    for t in batches:
        step(batches[t])  # warm
    times = {t: [] for t in batches}
    for _ in range(steps):
        for t, batch in batches.items():
            start, wall = _cpu(), time.perf_counter()
            step(batch)
            times[t].append((_cpu() - start, time.perf_counter() - wall))
    for t, values in times.items():
        result[f"T{t}_cpu"] = statistics.median(v[0] for v in values)
        result[f"T{t}_wall"] = statistics.median(v[1] for v in values)
        result[f"T{t}_cpu_min"] = min(v[0] for v in values)
    traces = []
    for _ in range(3):  # the step traced again (a new tf.function): tracing alone
        start = _cpu()
        tf.function(clf.train_step).get_concrete_function(_spec())
        traces.append(_cpu() - start)
    result["trace_cpu_min"] = min(traces)
    print(json.dumps(result))


def time_variants(variants, rounds, steps):
    results = collections.defaultdict(list)
    print("load average at start:", os.getloadavg())
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for label, path in order:
            path, _, threads = path.partition("@")
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--steps", str(steps)]
            if threads:
                cmd += ["--threads", threads]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            values = json.loads(out.stdout.strip().splitlines()[-1])
            results[label].append(values)
            print(f"round {r} {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()),
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print("load average at end:", os.getloadavg())
    for label, runs in results.items():
        keys = runs[0].keys()
        print(f"{label} (medians of {len(runs)} processes): " + ", ".join(
            f"{k} {statistics.median(run[k] for run in runs):.3f}" for k in keys))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--keras-hub", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--variants", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--threads", default="")
    args = parser.parse_args()
    if args.worker:
        threads = tuple(int(v) for v in args.threads.split(",")) if args.threads else None
        return worker(args.steps, threads)
    if args.count:
        count(args.keras_hub)
    if args.time:
        time_variants([tuple(v.split("=", 1)) for v in args.variants], args.rounds, args.steps)


if __name__ == "__main__":
    main()
