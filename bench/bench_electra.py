"""Cost of one ELECTRA-Small pretraining step vs one MLM step of the discriminator alone.

Setup: the ELECTRA-Small discriminator config (L12/H256/E128/A4, vocabulary 30522) with its
generator at 1/4 width (the paper's Small generator: H64, 1 head, intermediate 256), and a
`MaskedLM` on an identical discriminator config. Both train with `train_on_batch` (AdamW, jit as
Keras' default for the backend) on the same synthetic batch (batch 32 x length 128, 20 masked
slots, keras-hub's format). After `--warmup` steps we time `--steps` steps of each, alternating
models in rounds so that machine load hits both alike, and print the median step times and
their ratio (target: ELECTRA at most 1.4x the MLM step).

Usage: KERAS_BACKEND=tensorflow python bench/bench_electra.py [--batch 32] [--length 128]
Not a test: numbers depend on the machine and its load.

Measured (2 CPU cores shared with ~5 other jobs, load average 10-14, so the absolute step times
are inflated; the ratio compares the two models in the same, interleaved run):
    tensorflow, --steps 10: ELECTRA 21179.8 ms, MLM 18493.1 ms, ratio 1.15x
    jax,        --steps 6:  ELECTRA 29088.1 ms, MLM 22564.7 ms, ratio 1.29x
"""
import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import keras_bertfam as kb  # noqa: E402
from keras_bertfam.presets import get  # noqa: E402

SMALL = "electra_small_discriminator_uncased_en"


def batch(batch_size, length, predictions, vocab=30522, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, (batch_size, length)).astype("int32")
    ids[:, 0], ids[:, -1] = 101, 102
    positions = np.sort(np.stack([rng.choice(np.arange(1, length - 1), predictions, replace=False)
                                  for _ in range(batch_size)]), axis=1).astype("int32")
    mask_ids = np.take_along_axis(ids, positions, 1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 103, 1)
    x = {"token_ids": masked, "segment_ids": np.zeros_like(ids),
         "padding_mask": np.ones_like(ids), "mask_positions": positions}
    return x, mask_ids, np.ones(positions.shape, "float32")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.25)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    config = dict(get(SMALL).config, max_sequence_length=max(512, args.length))
    electra = kb.tasks.ElectraPretrainer(
        discriminator=kb.models.ElectraBackbone(**config),
        generator_hidden_fraction=args.fraction, seed=0)
    mlm = kb.tasks.MaskedLM(kb.models.ElectraBackbone(**config))
    for model in (electra, mlm):
        model.compile(learning_rate=5e-4)
    x, y, w = batch(args.batch, args.length, args.predictions)

    for _ in range(args.warmup):
        electra.train_on_batch(x, y, sample_weight=w)
        mlm.train_on_batch(x, y, sample_weight=w)
    times = {"electra": [], "mlm": []}
    for _ in range(args.steps):
        for name, model in (("electra", electra), ("mlm", mlm)):
            start = time.perf_counter()
            model.train_on_batch(x, y, sample_weight=w)
            times[name].append(time.perf_counter() - start)
    e, m = np.median(times["electra"]), np.median(times["mlm"])
    g = electra.generator
    print(f"backend={keras.backend.backend()} batch={args.batch} length={args.length} "
          f"predictions={args.predictions} steps={args.steps}")
    print(f"discriminator params {electra.discriminator.num_params():,}; generator "
          f"H{g.hidden_dim}/A{g.num_heads}/I{g.intermediate_dim}, params (shared tables "
          f"included) {g.num_params():,}")
    print(f"ELECTRA step {e * 1000:.1f} ms, MLM step {m * 1000:.1f} ms, ratio {e / m:.2f}x")


if __name__ == "__main__":
    main()
