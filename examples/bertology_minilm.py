"""BERTology on the MiniLM Rotten Tomatoes classifier: head importance, the pruning curve, and a
structurally pruned model served from a SavedModel.

Protocol: `finetune_minilm_rotten_tomatoes.py`'s (the real `all_minilm_l6_v2`, 6 layers x 12
heads = 72 heads; 2 epochs on 7,677 sentences; the same seeded 853-sentence dev split). Then:
1. Michel et al.'s head importance (|d loss / d head mask|, per-layer L2 normalized) on 512
   *training* sentences (heads are chosen on training data, accuracy is measured on dev):
   `head_importance.png`.
2. Michel et al.'s loop: mask the least important 10% of the heads, re-score, repeat up to 50%,
   dev accuracy at each step: `pruning_curve.csv` / `.png`.
3. The most-pruned step with >= 30% of the heads removed and dev accuracy within 1 point of the
   unpruned model is pruned STRUCTURALLY (`kb.analysis.prune_heads`), its dev accuracy measured
   again, both models exported as string-in SavedModels, and their serving throughput compared
   (`bench/bench_pruned_serving.py`, interleaved in one process).
4. An attention grid and one head's token map for a dev sentence.

Run: `python examples/bertology_minilm.py [--finetuned DIR] [--output DIR]` (trains and saves the
classifier to --finetuned when the directory has none).

Measured with the full protocol (TensorFlow, `python examples/bertology_minilm.py`, 2 CPU cores
with nothing else running, 2026-11-23; 20.3 min wall in all, this machine ran the fine-tune ~2x
slower than on 2026-11-22):
- fine-tune: 2 epochs x 245 steps (304 s and 265 s), 9.7 min; unpruned dev accuracy 0.8300
  (853 sentences);
- head importance on 512 training sentences: done at 11.3 min (`head_importance.png`);
- pruning curve (dev accuracy; the masked heads' importances re-scored at each step,
  `pruning_curve.csv/png`): 0 heads 0.8300; 7 (9.7%) 0.8324; 14 (19.4%) 0.8183; 21 (29.2%) 0.8312;
  28 (38.9%) 0.8218 (-0.82 point); 35 (48.6%) 0.8159; 36 (50%) 0.8171. The example picks the
  28-head step (the most pruned within 1 point with >= 30% removed): layer 0 loses 1 head, layer
  5 eight, layers 1-4 four or five each.
- structurally pruned (28 heads removed): dev accuracy 0.8218, as masked; backbone parameters
  21,334,272 vs 22,713,216 (-1,378,944 = 28 x 49,248); SavedModel 85.2 MB vs 90.5 MB; serving
  throughput (string-in `serving_default`, batch 32, dev sentences, 12 interleaved rounds):
  91.0 vs 74.9 sentences/s, 1.22x (medians 352 ms vs 427 ms per batch). 39% of the heads is 13%
  of the encoder's matmul FLOPs at these lengths (1.38M of its 10.6M weights; the feed-forward
  layers are untouched), i.e. ~1.15x expected from FLOPs alone.
An earlier run under heavy load (load 20-27, shortened fine-tune) measured no speedup: noise.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import keras_bertfam as kb  # noqa: E402
from bench_pruned_serving import bench  # noqa: E402
from finetune_minilm_rotten_tomatoes import finetune, rotten_tomatoes_split  # noqa: E402


def accuracy(clf, texts, labels):
    logits = clf.predict(tf.data.Dataset.from_tensor_slices(texts).batch(64), verbose=0)
    return float(np.mean(np.argmax(logits, -1) == labels))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finetuned", default="/tmp/bertology/minilm_rt")
    parser.add_argument("--output", default="/tmp/bertology/minilm_out")
    parser.add_argument("--importance-sentences", type=int, default=512)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--train-sentences", type=int, default=0,
                        help="fine-tune on only the first N training sentences (0: all)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    start = time.time()
    os.makedirs(args.output, exist_ok=True)

    texts, labels, train, dev = rotten_tomatoes_split(args.seed)
    if os.path.exists(os.path.join(args.finetuned, "keras_bertfam.json")):
        clf = kb.tasks.TextClassifier.from_preset(args.finetuned)
    else:
        subset = train[: args.train_sentences] if args.train_sentences else train
        clf = finetune(texts, labels, subset, epochs=args.epochs, seed=args.seed)
        clf.save_to_preset(args.finetuned)
        print(f"fine-tuned on {len(subset)} sentences, {args.epochs} epochs "
              f"({(time.time() - start) / 60:.1f} min)", flush=True)
    dev_data = (texts[dev], labels[dev])
    scoring = train[: args.importance_sentences]
    score_data = (texts[scoring], labels[scoring])
    base = accuracy(clf, *dev_data)
    print(f"unpruned dev accuracy {base:.4f}", flush=True)

    result = kb.analysis.head_importance(clf, score_data, accuracy_drop=False)
    kb.analysis.plot_heads(result.importance, os.path.join(args.output, "head_importance.png"),
                           title="MiniLM / Rotten Tomatoes: head importance (Michel et al.)")
    print(f"head importance done ({(time.time() - start) / 60:.1f} min)", flush=True)

    curve = kb.analysis.iterative_pruning(
        clf, dev_data, target=args.target, step=args.step, importance_data=score_data,
        progress=lambda row: print(f"  {row}", flush=True))
    curve.write(args.output, title="MiniLM / Rotten Tomatoes: dev accuracy vs heads pruned")
    ok = [i for i, row in enumerate(curve.rows)
          if row["fraction_pruned"] >= 0.3 and row["accuracy"] >= base - 0.01]
    chosen = ok[-1] if ok else max(range(len(curve.rows)),
                                   key=lambda i: (curve.rows[i]["fraction_pruned"] >= 0.3,
                                                  curve.rows[i]["accuracy"]))
    plan = curve.plan(chosen)
    pruned = kb.analysis.prune_heads(clf, plan)
    pruned_acc = accuracy(pruned, *dev_data)
    n_pruned = sum(len(h) for h in plan.values())
    params = (clf.backbone.num_params(), pruned.backbone.num_params())
    print(f"pruned {n_pruned}/72 heads ({n_pruned / 72:.1%}): dev accuracy {pruned_acc:.4f} "
          f"(unpruned {base:.4f}); backbone parameters {params[1]:,} vs {params[0]:,}")

    exports = {}
    for name, model in (("unpruned", clf), ("pruned", pruned)):
        path = os.path.join(args.output, "export", name, "1")
        if os.path.isdir(path):
            import shutil

            shutil.rmtree(path)
        kb.export.export_saved_model(model, path)
        assert not kb.export.audit_ops(path)["unsupported"]
        exports[name] = path
    serving = bench(exports["unpruned"], exports["pruned"], list(texts[dev][:256]), rounds=12)

    maps = kb.analysis.attention_maps(pruned, [texts[dev][0]])
    kb.analysis.plot_attention(maps, os.path.join(args.output, "attention_grid.png"))
    kb.analysis.plot_attention(maps, os.path.join(args.output, "attention_L2_H0.png"),
                               layer=2, head=0)
    summary = {"unpruned_dev_accuracy": base, "pruned_dev_accuracy": pruned_acc,
               "heads_pruned": n_pruned, "plan": plan, "curve": curve.rows,
               "backbone_params": params, "serving": serving,
               "minutes": (time.time() - start) / 60}
    with open(os.path.join(args.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=float)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("curve", "plan")},
                     indent=1, default=float))


if __name__ == "__main__":
    main()
