"""Torch's train step with and without `Task._seed_torch_step` (torch's global random state
seeded each step, so that a resumed fit draws the uninterrupted run's dropout masks), in
interleaved rounds in one process: CPU ms a step (user + system, getrusage) of a fit of STEPS
steps of a tiny TextClassifier (preprocessor=None, token ids in memory, dropout 0.1), then the
added call alone (timeit). BUILD.md, "One pipeline a fit".

Run: STEPS=40 ROUNDS=3 KERAS_BACKEND=torch python bench/bench_torch_dropout_seed.py
"""
import contextlib
import os
import resource
import time
import timeit

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_bertfam as kb  # noqa: E402
from keras_bertfam.tasks import task as task_module  # noqa: E402

STEPS, ROUNDS = int(os.environ.get("STEPS", 40)), int(os.environ.get("ROUNDS", 3))
seeded_step_seed = task_module.Task._seed_torch_step
seeded_kept = task_module._global_torch_random_state_kept


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


keras.utils.set_random_seed(0)
backbone = kb.models.BertBackbone(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=32,
                                  intermediate_dim=64, max_sequence_length=64, dropout=0.1)
task = kb.tasks.TextClassifier(backbone, num_classes=2, dropout=0.1)
task.compile()
n = 8 * STEPS
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(5, 1000, (n, 32)).astype("int32"),
     "segment_ids": np.zeros((n, 32), "int32"), "padding_mask": np.ones((n, 32), "int32")}
y = rng.integers(0, 2, n)
task.fit({k: v[:16] for k, v in x.items()}, y[:16], batch_size=8, verbose=0)  # warm up
results = {"before": [], "after": []}
for r in range(ROUNDS):
    for mode in (("before", "after") if r % 2 == 0 else ("after", "before")):
        if mode == "before":  # the step as on main: no seeding, torch's state not kept
            task_module.Task._seed_torch_step = lambda self: None
            task_module._global_torch_random_state_kept = contextlib.nullcontext
        else:
            task_module.Task._seed_torch_step = seeded_step_seed
            task_module._global_torch_random_state_kept = seeded_kept
        c0, t0 = cpu(), time.perf_counter()
        task.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        c1, t1 = cpu(), time.perf_counter()
        results[mode].append(((c1 - c0) / STEPS * 1e3, (t1 - t0) / STEPS * 1e3))
        print(f"round {r} {mode}: {results[mode][-1][0]:.3f} ms CPU/step, "
              f"{results[mode][-1][1]:.3f} ms wall/step, load {os.getloadavg()[0]:.2f}", flush=True)
for mode, vals in results.items():
    c = sorted(v[0] for v in vals)
    print(f"{mode}: CPU ms/step median {np.median(c):.3f} min {c[0]:.3f} max {c[-1]:.3f}")
import torch  # noqa: E402

task.__dict__["_torch_step"] = None
added = min(timeit.repeat(lambda: seeded_step_seed(task), number=1000, repeat=5))
every_device = min(timeit.repeat(lambda: torch.manual_seed(12345), number=1000, repeat=5))
print(f"the added call alone: {added * 1e3:.1f} us; torch.manual_seed: {every_device * 1e3:.1f} us")
