"""What the in-pipeline id check (`kb.tasks.task.check_ids`, a task's `tf.data` map over a
dataset of model inputs with preprocessor=None) costs a batch: a dataset of BATCHES batches of
B x T token / segment ids and padding masks, read to its end with and without the check's map,
in interleaved rounds in one process. Prints CPU us a batch (user + system, getrusage; tf.data's
threads included) for each; then a `fit` of STEPS steps of the task (1 layer, hidden 16, the
BERT vocabulary) on that dataset with the check (as `fit` builds it) and without (the check's
map removed), interleaved: CPU ms a step. BUILD.md, "Ids out of range in a dataset".

Run: B=32 T=128 BATCHES=3000 ROUNDS=6 STEPS=100 python bench/bench_id_check.py
"""
import os
import resource
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_bertfam as kb  # noqa: E402

B, T = int(os.environ.get("B", 32)), int(os.environ.get("T", 128))
BATCHES, ROUNDS = int(os.environ.get("BATCHES", 3000)), int(os.environ.get("ROUNDS", 6))
STEPS = int(os.environ.get("STEPS", 100))


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    backbone = kb.models.BertBackbone(vocabulary_size=30522, num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32,
                                      max_sequence_length=T)
    task = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=None)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 30522, (B, T), dtype="int32"),
         "segment_ids": rng.integers(0, 2, (B, T), dtype="int32"),
         "padding_mask": np.ones((B, T), "int32")}
    base = tf.data.Dataset.from_tensors((x, np.zeros(B, "int32"))).repeat(BATCHES)
    kinds = {"without": base, "with": task._checked_model_inputs(base)}
    assert kinds["with"] is not base
    for ds in kinds.values():  # warm up: traced, first iterator made
        for _ in ds.take(10):
            pass
    results = {k: [] for k in kinds}
    for r in range(ROUNDS):
        order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]
        for kind in order:
            c, w = cpu(), time.perf_counter()
            for _ in kinds[kind]:
                pass
            results[kind].append(((cpu() - c) / BATCHES * 1e6,
                                  (time.perf_counter() - w) / BATCHES * 1e6))
    print(f"B={B} T={T} batches={BATCHES} load={os.getloadavg()[0]:.2f}")
    for kind, rows in results.items():
        print(f"{kind:>8}: CPU us/batch " + ", ".join(f"{c:.1f}" for c, _ in rows)
              + " | wall us/batch " + ", ".join(f"{w:.1f}" for _, w in rows))
    fit_steps(task, base)


def fit_steps(task, base):
    """CPU ms a train step of `fit` on STEPS batches, with the check and without it."""
    data = base.take(STEPS)
    checked = task._checked_model_inputs
    task.fit(data.take(5), verbose=0)  # traced
    results = {"without": [], "with": []}
    for r in range(ROUNDS):
        order = list(results) if r % 2 == 0 else list(results)[::-1]
        for kind in order:
            if kind == "without":
                object.__setattr__(task, "_checked_model_inputs", lambda x: x)
            c = cpu()
            task.fit(data, verbose=0)
            results[kind].append((cpu() - c) / STEPS * 1e3)
            task.__dict__.pop("_checked_model_inputs", None)
    assert task._checked_model_inputs == checked
    print(f"fit, {STEPS} steps, load={os.getloadavg()[0]:.2f}")
    for kind, rows in results.items():
        print(f"{kind:>8}: CPU ms/step " + ", ".join(f"{c:.2f}" for c in rows))


if __name__ == "__main__":
    main()
