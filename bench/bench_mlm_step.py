"""MLM train-step throughput: `kb.tasks.MaskedLM` vs keras-hub 0.32's `BertMaskedLM`, same run.

Setup: BERT-Mini-like config (L4 / H256 / A4, intermediate 1024, vocabulary 30522, dropout 0.1),
batch 16 x length 128 with 20 prediction slots per sequence (keras-hub's preprocessed format:
token_ids, segment_ids, padding_mask, mask_positions; labels mask_ids, sample_weight
mask_weights). Ours is `kb.tasks.MaskedLM(kb.models.BertBackbone(...))`; theirs is
`keras_hub.models.BertMaskedLM(keras_hub.models.BertBackbone(...), preprocessor=None)` with its
default loss and weighted metric. keras-hub's BERT uses the tanh-approximate GELU, so "ours" uses
`activation="gelu_approximate"` (the same math); the extra row "ours-erf" is our BERT default,
the exact erf GELU (default jit only), to show what the exact activation costs. Both are compiled with the same optimizer settings (AdamW, lr
1e-4, weight decay 0.01 except LayerNorm/bias, β2 0.999, ε 1e-6, global clipnorm 1.0), once with
Keras' default `jit_compile` ("auto": no XLA for TensorFlow on CPU, XLA for JAX, eager for
PyTorch) and once with `jit_compile=True` (XLA; on PyTorch torch.compile, only with
`--torch-compile`: compiling took over 20 minutes on this 2-CPU machine). All four models train
with `train_on_batch` on the same batch; after `--warmup` steps each, `--rounds` rounds step them
in turn (ours, theirs, ours-XLA, theirs-XLA, plus one 2048² matmul sample per path), so machine
load falls alike on each; we report median step times and the median over rounds of
the paired ratio (keras-hub's step time / ours in the same round: robust to load drifting).

Model FLOPs per step (analytic, forward + backward = 3 x forward, multiply-add = 2 FLOPs):

    FLOPs = 6 * N_mm * B * T                      # matmul weights of the encoder
          + 3 * 4 * L * B * T^2 * H               # attention scores QK^T and context PV
          + 6 * B * P * (H * E + E * V)           # MLM head on the P gathered positions:
                                                  # transform H->E and tied vocab projection

with N_mm = L * (4 H^2 + 2 H I) (Q, K, V, output, and the two feed-forward kernels; embedding
lookups, biases, LayerNorms, the unused pooler are not matmuls). Model-FLOPs utilization (MFU) =
FLOPs / step time / the matmul ceiling, where the ceiling is MEASURED in the same run: a float32
2048 x 2048 matmul (2 * 2048^3 FLOPs) timed through the same backend: the default path (TF eager
oneDNN, JAX jit, torch eager) for the default rows, XLA (`tf.function(jit_compile=True)`,
`jax.jit`) for the XLA rows.

Usage: python bench/bench_mlm_step.py [--backend tensorflow|jax|torch|all|tf,jax] [--rounds 10]
Each backend runs in its own subprocess. Not a test: numbers depend on the machine and its load
(the load average is printed with each result).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
BACKENDS = ("tensorflow", "jax", "torch")
CONFIG = dict(vocabulary_size=30522, num_layers=4, num_heads=4, hidden_dim=256,
              intermediate_dim=1024, max_sequence_length=512)
MATMUL_N = 2048
RESULT_TAG = "RESULT_JSON "


def model_flops(batch, length, predictions, cfg=CONFIG):
    """Analytic model FLOPs of one train step (see the module docstring)."""
    L, H, I, V = cfg["num_layers"], cfg["hidden_dim"], cfg["intermediate_dim"], cfg[
        "vocabulary_size"]
    E = H
    n_mm = L * (4 * H * H + 2 * H * I)
    dense = 6 * n_mm * batch * length
    attention = 3 * 4 * L * batch * length * length * H
    head = 6 * batch * predictions * (H * E + E * V)
    return dense + attention + head, dict(dense=dense, attention=attention, head=head)


def make_batch(batch_size, length, predictions, vocab, seed=0):
    import numpy as np

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


# ---------------------------------------------------------------- child (one backend) ----------

def make_optimizer():
    import keras

    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, beta_2=0.999,
                                       epsilon=1e-6, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["layer_norm", "bias", "gamma", "beta"])
    return optimizer


def build_models(jit_modes, erf_row=True):
    import keras
    import keras_hub

    sys.path.insert(0, ROOT)
    import keras_bertfam as kb

    models = {}
    for jit in jit_modes:
        keras.utils.set_random_seed(0)
        ours = kb.tasks.MaskedLM(kb.models.BertBackbone(**CONFIG,
                                                        activation="gelu_approximate"))
        ours.compile(optimizer=make_optimizer(), jit_compile=jit)
        keras.utils.set_random_seed(0)
        theirs = keras_hub.models.BertMaskedLM(keras_hub.models.BertBackbone(**CONFIG),
                                               preprocessor=None)
        theirs.compile(optimizer=make_optimizer(), jit_compile=jit)  # default loss + metric
        models[("ours", jit)] = ours
        models[("keras-hub", jit)] = theirs
        if erf_row and jit == jit_modes[0]:
            keras.utils.set_random_seed(0)
            erf = kb.tasks.MaskedLM(kb.models.BertBackbone(**CONFIG, activation="gelu"))
            erf.compile(optimizer=make_optimizer(), jit_compile=jit)
            models[("ours-erf", jit)] = erf
    return models


def matmul_timers(backend):
    """{path: fn() -> seconds for one 2048² float32 matmul} on the given backend."""
    import numpy as np

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((MATMUL_N, MATMUL_N)).astype("float32")
    b_np = rng.standard_normal((MATMUL_N, MATMUL_N)).astype("float32")
    timers = {}
    if backend == "tensorflow":
        import tensorflow as tf

        a, b = tf.constant(a_np), tf.constant(b_np)
        fns = {"default": lambda: tf.matmul(a, b),
               "xla": tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)), jit_compile=True)}
        sync = lambda r: r.numpy() if r.shape.rank == 0 else r[0, 0].numpy()
    elif backend == "jax":
        import jax

        a, b = jax.device_put(a_np), jax.device_put(b_np)
        f = jax.jit(lambda x, y: x @ y)
        fns = {"default": lambda: f(a, b), "xla": lambda: f(a, b)}
        sync = lambda r: r.block_until_ready()
    else:
        import torch

        a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)
        fns = {"default": lambda: torch.matmul(a, b), "xla": lambda: torch.matmul(a, b)}
        sync = lambda r: r
    for path, fn in fns.items():
        def timer(fn=fn):
            start = time.perf_counter()
            sync(fn())
            return time.perf_counter() - start
        for _ in range(2):
            timer()
        timers[path] = timer
    return timers


def child(args):
    import keras
    import numpy as np

    backend = keras.backend.backend()
    jit_modes = ["auto", True] if args.jit == "both" else [
        "auto" if args.jit == "auto" else True]
    if backend == "torch" and args.jit == "both" and not args.torch_compile:
        jit_modes = ["auto"]  # torch.compile of these models ran > 20 min on 2 CPUs: opt in
    x, y, w = make_batch(args.batch, args.length, args.predictions, CONFIG["vocabulary_size"])
    models = build_models(jit_modes, erf_row=not args.no_erf_row)
    timers = matmul_timers(backend)
    load_start = os.getloadavg()

    failed = {}
    for _ in range(args.warmup):
        for key, model in models.items():
            if any(k.startswith(f"{key[0]} jit_compile={key[1]}") for k in failed):
                continue
            try:
                model.train_on_batch(x, y, sample_weight=w)
            except Exception as e:  # e.g. torch.compile without a C++ toolchain: report it
                failed[f"{key[0]} jit_compile={key[1]}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    times = {key: [] for key in models if f"{key[0]} jit_compile={key[1]}" not in failed}
    matmul = {path: [] for path in timers}
    for _ in range(args.rounds):
        for key in times:
            start = time.perf_counter()
            models[key].train_on_batch(x, y, sample_weight=w)
            times[key].append(time.perf_counter() - start)
        for path, timer in timers.items():
            matmul[path].append(timer())
    load_end = os.getloadavg()

    flops, parts = model_flops(args.batch, args.length, args.predictions)
    ceiling = {p: 2 * MATMUL_N ** 3 / float(np.median(t)) / 1e9 for p, t in matmul.items()}
    tokens = args.batch * args.length
    rows = []
    for (name, jit), t in times.items():
        step = float(np.median(t))
        path = "xla" if (jit is True and backend != "torch") or backend == "jax" else "default"
        kh = times.get(("keras-hub", jit))
        paired = float(np.median(np.array(kh) / np.array(t))) if kh else None
        rows.append(dict(model=name, jit=str(jit), step_ms=step * 1000, step_min_ms=min(t) * 1000,
                         paired_ratio=paired,
                         tokens_per_s=tokens / step, gflops_per_s=flops / step / 1e9,
                         ceiling=path, mfu=flops / step / 1e9 / ceiling[path]))
    result = dict(backend=backend, batch=args.batch, length=args.length,
                  predictions=args.predictions, rounds=args.rounds, warmup=args.warmup,
                  flops_per_step=flops, flops_parts=parts, matmul_gflops=ceiling,
                  load_start=load_start, load_end=load_end, rows=rows, failed=failed,
                  params={name: int(sum(int(np.prod(v.shape)) for v in models[(name, jit_modes[0])]
                                        .trainable_weights))
                          for name in ("ours", "keras-hub")})
    print(RESULT_TAG + json.dumps(result), flush=True)


# ---------------------------------------------------------------- parent -----------------------

def print_table(r):
    print(f"\n[{r['backend']}] batch {r['batch']} x length {r['length']}, {r['predictions']} "
          f"predictions/seq, {r['rounds']} rounds after {r['warmup']} warmup; load average "
          f"{r['load_start'][0]:.1f} -> {r['load_end'][0]:.1f} (1 min)")
    p = r["flops_parts"]
    print(f"model FLOPs/step {r['flops_per_step'] / 1e9:.1f} G (encoder matmuls "
          f"{p['dense'] / 1e9:.1f}, attention {p['attention'] / 1e9:.1f}, MLM head "
          f"{p['head'] / 1e9:.1f}); trainable params ours {r['params']['ours']:,}, keras-hub "
          f"{r['params']['keras-hub']:,}")
    print("matmul ceiling (2048² f32): " + ", ".join(
        f"{path} {g:.0f} GFLOP/s" for path, g in r["matmul_gflops"].items()))
    print(f"{'jit_compile':12s} {'model':10s} {'step ms':>8s} {'min ms':>8s} {'tokens/s':>9s} "
          f"{'GFLOP/s':>8s} {'MFU':>6s} {'x kh':>6s} {'paired':>7s}")
    by = {(row["jit"], row["model"]): row for row in r["rows"]}
    for (jit, model), row in by.items():
        other = by.get((jit, "keras-hub"))
        ratio = (f"{row['tokens_per_s'] / other['tokens_per_s']:6.2f} "
                 f"{row['paired_ratio']:7.2f}" if model != "keras-hub" and other else "")
        print(f"{jit:12s} {model:10s} {row['step_ms']:8.1f} {row['step_min_ms']:8.1f} "
              f"{row['tokens_per_s']:9.0f} {row['gflops_per_s']:8.1f} {row['mfu']:6.1%} {ratio}")
    for key, why in r["failed"].items():
        print(f"FAILED {key}: {why}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow",
                        help="tensorflow, jax, torch, a comma list, or all")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--jit", default="both", choices=("both", "auto", "xla"))
    parser.add_argument("--no-erf-row", action="store_true",
                        help="skip the exact-GELU model (ours-erf)")
    parser.add_argument("--torch-compile", action="store_true",
                        help="with --jit both on torch, also time jit_compile=True "
                             "(torch.compile; very slow to compile on CPU)")
    parser.add_argument("--timeout", type=float, default=1800, help="per backend, seconds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    backends = BACKENDS if args.backend == "all" else [
        {"tf": "tensorflow"}.get(b, b) for b in args.backend.split(",")]
    results = []
    for backend in backends:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + [
            a for a in sys.argv[1:] if not a.startswith("--backend")
            and a not in backends and a != args.backend]
        print(f"running {backend} ...", flush=True)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"[{backend}] timed out after {args.timeout:.0f} s")
            continue
        lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_TAG)]
        if proc.returncode or not lines:
            print(f"[{backend}] failed (exit {proc.returncode}):\n" + proc.stderr[-3000:])
            continue
        results.append(json.loads(lines[-1][len(RESULT_TAG):]))
        print_table(results[-1])
    print("\n=== summary: MLM train step, ours vs keras-hub BertMaskedLM ===")
    print("(ours: same GELU as keras-hub; ours/kh: ratio of median tokens/s; paired: median over "
          "rounds of the same-round ratio; erf/kh: our exact-GELU default vs keras-hub)")
    print(f"{'backend':11s} {'jit':5s} {'ours tok/s':>10s} {'kh tok/s':>9s} {'ours/kh':>8s} "
          f"{'paired':>7s} {'erf/kh':>7s} {'ours MFU':>8s} {'kh MFU':>7s} {'matmul GF/s':>11s} "
          f"{'load 1-min':>10s}")
    for r in results:
        by = {(row["jit"], row["model"]): row for row in r["rows"]}
        for jit in dict.fromkeys(row["jit"] for row in r["rows"]):
            o, k = by.get((jit, "ours")), by.get((jit, "keras-hub"))
            if not (o and k):
                continue
            e = by.get((jit, "ours-erf"))
            erf = f"{e['tokens_per_s'] / k['tokens_per_s']:.2f}" if e else "-"
            print(f"{r['backend']:11s} {'xla' if jit == 'True' else 'auto':5s} "
                  f"{o['tokens_per_s']:10.0f} {k['tokens_per_s']:9.0f} "
                  f"{o['tokens_per_s'] / k['tokens_per_s']:8.2f} {o['paired_ratio']:7.2f} "
                  f"{erf:>7s} {o['mfu']:8.1%} {k['mfu']:7.1%} "
                  f"{r['matmul_gflops'][o['ceiling']]:11.0f} "
                  f"{r['load_start'][0]:4.1f}->{r['load_end'][0]:4.1f}")
    return 0 if len(results) == len(backends) else 1


if __name__ == "__main__":
    sys.exit(main())
