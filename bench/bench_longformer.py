"""Longformer cost against length: ours vs HF's LongformerModel vs full-attention RoBERTa.

One forward + backward (loss = sum of the last hidden states) at batch 1 and T = 512, 1,024,
2,048, 4,096 for three models of the longformer-base-4096 sizes (L12/H768/A12, vocabulary 50265,
4,098 positions, dropout 0, random weights):
  ours  kb.models.LongformerBackbone, window 512, global attention on <s>  (KERAS_BACKEND=torch)
  hf    transformers.LongformerModel, same config and global mask           (PyTorch)
  full  kb.models.RobertaBackbone with max_sequence_length=4096: full attention (KERAS_BACKEND=torch)
All three run on PyTorch (CPU, 2 threads), so times compare kernels of one framework.

Each (model, T) runs in its own subprocess: build, one warm-up step, then `--reps` timed steps
(median; `--reps 0`: the warm-up step's time). Peak memory is the process's peak RSS (VmHWM,
reset after building the model and its input) minus its RSS then: the step's activations,
gradients and workspace. The rounds go through the
lengths in order and rotate the order of the models, so machine load hits them alike. Ratios:
ours / hf time, ours / full time, and ours' memory at 4,096 / 1,024 (linear: 4; target <= 4.5).

Usage: python bench/bench_longformer.py [--lengths 512 1024 2048 4096] [--reps 2]
           [--full-max 4096]      # full attention only up to this length
           [--max-rss-gb 16 --min-free-gb 2.5]  # a worker is killed past these (shared machine)
           [--num-layers 12]      # the base width with fewer layers, when the machine is loaded
           [--interleaved]        # ours and full in one process, steps alternated: ratios that
                                  # hold under load (times only; --reps steps each, median)
Not a test: numbers depend on the machine and its load.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = dict(vocabulary_size=50265, num_layers=12, num_heads=12, hidden_dim=768,
            intermediate_dim=3072)


def _rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_rss_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def worker(model, length, reps, window, num_layers=12):
    import numpy as np
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, BASE["vocabulary_size"], (1, length)).astype("int64")
    ids[0, 0] = 0
    global_mask = np.zeros_like(ids)
    global_mask[0, 0] = 1
    if model == "hf":
        import transformers

        config = transformers.LongformerConfig(
            vocab_size=BASE["vocabulary_size"], hidden_size=768, num_hidden_layers=num_layers,
            num_attention_heads=12, intermediate_size=3072, max_position_embeddings=4098,
            type_vocab_size=1, attention_window=window, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, pad_token_id=1)
        net = transformers.LongformerModel(config).train()
        inputs = dict(input_ids=torch.tensor(ids), attention_mask=torch.ones_like(torch.tensor(ids)),
                      global_attention_mask=torch.tensor(global_mask))

        def step():
            net.zero_grad(set_to_none=True)
            net(**inputs).last_hidden_state.sum().backward()
    else:
        os.environ["KERAS_BACKEND"] = "torch"
        sys.path.insert(0, os.path.join(HERE, ".."))
        import keras_bertfam as kb

        if model == "ours":
            net = kb.models.LongformerBackbone(**dict(BASE, num_layers=num_layers),
                                               attention_window=window, dropout=0.0,
                                               max_sequence_length=4096)
        else:
            net = kb.models.RobertaBackbone(**dict(BASE, num_layers=num_layers), dropout=0.0,
                                            max_sequence_length=4096)
        inputs = {"token_ids": torch.tensor(ids, dtype=torch.int32),
                  "segment_ids": torch.zeros((1, length), dtype=torch.int32),
                  "padding_mask": torch.ones((1, length), dtype=torch.int32)}
        if model == "ours":
            inputs["global_attention_mask"] = torch.tensor(global_mask, dtype=torch.int32)
        inputs = {k: v for k, v in inputs.items() if k in net.input}
        params = [v.value for v in net.trainable_variables]

        def step():
            for p in params:
                p.grad = None
            net(inputs, training=True)["sequence_output"].sum().backward()

    base_rss = _rss_kb()
    # Reset the peak RSS (VmHWM) so that building the model does not count (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = time.perf_counter()
    step()  # warm-up (its time is the one reported when reps=0)
    times = [time.perf_counter() - start] if reps == 0 else []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = _peak_rss_kb()
    print(json.dumps({"model": model, "length": length, "seconds": float(np.median(times)),
                      "peak_mb": (peak - base_rss) / 1024}))


def interleaved(lengths, reps, window, num_layers):
    """ours and full attention built in one process, their steps alternated (ours, full, full,
    ours, ...): both see the same machine load, so their ratio holds under a shared machine's
    load where the per-process table's does not. Times only (the process holds both models)."""
    import numpy as np
    import torch

    os.environ["KERAS_BACKEND"] = "torch"
    sys.path.insert(0, os.path.join(HERE, ".."))
    import keras_bertfam as kb

    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = dict(BASE, num_layers=num_layers)
    nets = {"ours": kb.models.LongformerBackbone(**config, attention_window=window, dropout=0.0,
                                                 max_sequence_length=4096),
            "full": kb.models.RobertaBackbone(**config, dropout=0.0, max_sequence_length=4096)}
    for length in lengths:
        ids = np.random.default_rng(0).integers(3, BASE["vocabulary_size"], (1, length))
        ids[0, 0] = 0
        global_mask = np.zeros_like(ids)
        global_mask[0, 0] = 1
        inputs = {"token_ids": torch.tensor(ids, dtype=torch.int32),
                  "segment_ids": torch.zeros((1, length), dtype=torch.int32),
                  "padding_mask": torch.ones((1, length), dtype=torch.int32),
                  "global_attention_mask": torch.tensor(global_mask, dtype=torch.int32)}

        def step(net):
            for v in net.trainable_variables:
                v.value.grad = None
            feed = {k: v for k, v in inputs.items() if k in net.input}
            start = time.perf_counter()
            net(feed, training=True)["sequence_output"].sum().backward()
            return time.perf_counter() - start

        times = {"ours": [], "full": []}
        step(nets["ours"]), step(nets["full"])  # warm-up
        for i in range(reps):
            for model in ("ours", "full") if i % 2 == 0 else ("full", "ours"):
                times[model].append(step(nets[model]))
        ours, full = (float(np.median(times[m])) for m in ("ours", "full"))
        print(f"{length:>4} ours {ours:7.2f} s  full {full:7.2f} s  ours/full {ours / full:5.2f}x  "
              f"(steps: ours {[round(t, 2) for t in times['ours']]}, "
              f"full {[round(t, 2) for t in times['full']]})", flush=True)


def _meminfo_gb(key):
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 2**20


def _run_guarded(cmd, max_rss_gb, min_free_gb):
    """Runs a worker; kills it if its RSS passes max_rss_gb or the machine's MemAvailable drops
    under min_free_gb (the machine is shared: an out-of-memory kill could hit someone else's
    process). Returns (CompletedProcess, None or the reason it was stopped)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        killed, peak = None, 0.0
        while child.poll() is None:
            try:
                with open(f"/proc/{child.pid}/status") as f:
                    rss = next(int(line.split()[1]) for line in f
                               if line.startswith("VmRSS:")) / 2**20
            except (OSError, StopIteration):
                rss = 0.0
            peak = max(peak, rss)
            if rss > max_rss_gb or _meminfo_gb("MemAvailable") < min_free_gb:
                child.kill()
                killed = (f"RSS {rss:.1f} GB (limit {max_rss_gb} GB), MemAvailable "
                          f"{_meminfo_gb('MemAvailable'):.1f} GB (floor {min_free_gb} GB)")
            time.sleep(0.1)
        child.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, child.returncode, out.read(), err.read()), killed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--window", type=int, default=512)
    # Full attention runs keras.ops.dot_product_attention, torch's fused SDPA kernel on CPU: no
    # T x T matrix is kept (measured +3.5 GB at 4,096, 12 layers), so it runs at every length.
    parser.add_argument("--full-max", type=int, default=4096)
    parser.add_argument("--num-layers", type=int, default=12)  # fewer under heavy load
    parser.add_argument("--max-rss-gb", type=float, default=16.0)  # a worker's RSS cap
    parser.add_argument("--min-free-gb", type=float, default=2.5)  # the machine's MemAvailable floor
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "LENGTH"))
    parser.add_argument("--interleaved", action="store_true",
                        help="ours and full in one process, steps alternated (times only)")
    args = parser.parse_args()
    if args.interleaved:
        return interleaved(args.lengths, max(args.reps, 1), args.window, args.num_layers)
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]), args.reps, args.window, args.num_layers)
    results = {}
    models = ["ours", "hf", "full"]
    for i, length in enumerate(args.lengths):
        order = models[i % 3:] + models[: i % 3]
        for model in order:
            if model == "full" and length > args.full_max:
                continue
            proc, killed = _run_guarded(
                [sys.executable, os.path.abspath(__file__), "--worker", model, str(length),
                 "--reps", str(args.reps), "--window", str(args.window),
                 "--num-layers", str(args.num_layers)], args.max_rss_gb, args.min_free_gb)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if killed:
                print(f"{model:>4} T={length:>4}: stopped, {killed}", flush=True)
                continue
            if proc.returncode or not lines:
                print(f"{model} T={length} failed: {proc.stderr[-800:]}", flush=True)
                continue
            r = json.loads(lines[-1])
            results[(model, length)] = r
            print(f"{model:>4} T={length:>4}: {r['seconds']:8.2f} s  peak +{r['peak_mb']:8.0f} MB",
                  flush=True)
    print("\n   T   ours s    hf s  full s  ours/hf  ours/full   ours MB   hf MB  full MB")
    for length in args.lengths:
        row = {m: results.get((m, length)) for m in models}

        def val(m, key, fmt):
            return format(row[m][key], fmt) if row[m] else "-".rjust(len(format(0.0, fmt)))

        def ratio(a, b):
            return f"{row[a]['seconds'] / row[b]['seconds']:7.2f}x" if row[a] and row[b] else \
                "       -"
        print(f"{length:>4} {val('ours', 'seconds', '8.2f')} {val('hf', 'seconds', '7.2f')} "
              f"{val('full', 'seconds', '7.2f')} {ratio('ours', 'hf')} {ratio('ours', 'full'):>10} "
              f"{val('ours', 'peak_mb', '9.0f')} {val('hf', 'peak_mb', '7.0f')} "
              f"{val('full', 'peak_mb', '8.0f')}")
    a, b = results.get(("ours", 4096)), results.get(("ours", 1024))
    if a and b:
        print(f"ours memory 4096/1024: {a['peak_mb'] / b['peak_mb']:.2f} (linear: 4, target <= 4.5)")


if __name__ == "__main__":
    main()
