"""`keras-bertfam analyze --task DIR --texts FILE --output DIR`: attention maps, Clark et al.'s
statistics and Michel et al.'s head importance of a trained preset, with a progress bar.

`cli.py` declares the parser (so that `--help` imports no TensorFlow) and calls `analyze`;
everything else lives here.
"""
import csv
import json
import os

from keras_bertfam.cli import CommandError


def _read_texts(path, limit):
    texts, labels, numbers = [], [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            text, sep, label = line.rpartition("\t")
            if sep and label.strip().lstrip("-").isdigit():
                texts.append(text)
                labels.append(int(label))
            else:
                texts.append(line)
                labels.append(None)
            numbers.append(number)
            if len(texts) == limit:
                break
    if not texts:
        raise CommandError(f"--texts {path} has no text: expected UTF-8 text, one text a "
                           "line.")
    labelled = [n for n, label in zip(numbers, labels) if label is not None]
    if labelled and len(labelled) < len(labels):  # all labels or none: never dropped silently
        i = next(i for i, label in enumerate(labels) if label is None)
        tail = texts[i].rpartition("\t")[2] if "\t" in texts[i] else None
        found = f" (it ends in {tail!r}, not an integer class id)" if tail is not None else ""
        raise CommandError(
            f"--texts {path} line {numbers[i]} has no label{found}, but line {labelled[0]} has "
            "one: give every line 'text<TAB>label' (an integer class id), or no line a label "
            "(the model's own predictions are then the labels).")
    return texts, (labels if labelled else None), numbers


def _check_labels(path, labels, numbers, model):
    """Labels of --texts outside the classifier's classes: a one-line error naming the line."""
    num_classes = getattr(model, "num_classes", None)
    if labels is None or not isinstance(num_classes, int) or num_classes < 2:
        return
    for label, number in zip(labels, numbers):
        if not 0 <= label < num_classes:
            raise CommandError(f"--texts {path} line {number}: label {label} is out of range: "
                               f"the model has {num_classes} classes (0 to {num_classes - 1}).")


def _write_heads_csv(path, tables):
    names = list(tables)
    first = tables[names[0]]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head"] + names)
        for layer in range(first.shape[0]):
            for head in range(first.shape[1]):
                row = [tables[n][layer, head] for n in names]
                if all(v != v for v in row):  # NaN: a pruned head
                    continue
                writer.writerow([layer, head] + [f"{v:.6g}" for v in row])


def analyze(args):
    import keras
    import numpy as np

    import keras_bertfam as kb
    from keras_bertfam import presets

    # (--max-texts, --plot-texts and --texts: checked by cli._check_analyze)
    if not os.path.isdir(args.task):
        raise CommandError(f"--task {args.task} is not a preset directory.")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise CommandError(f"--output {args.output} is a file: expected a directory (created "
                           "if missing).")
    if not os.path.isfile(os.path.join(args.task, presets.MANIFEST)):
        raise CommandError(
            f"--task {args.task} has no {presets.MANIFEST}: expected a keras_bertfam preset "
            "directory (model.save_to_preset(DIR)); load an HF or keras-hub directory in Python "
            "with kb.tasks.<Task>.from_preset(DIR) and save it with save_to_preset first.")
    manifest = presets._read_manifest(args.task)
    saved = manifest.get("task")
    if saved:
        model = getattr(kb.tasks, saved["class_name"]).from_preset(args.task, **saved["config"])
        tokenizer = None
    else:
        model = presets.load_backbone(args.task)
        tokenizer = presets.load_tokenizer(args.task)
    texts, labels, numbers = _read_texts(args.texts, args.max_texts)
    backbone = kb.analysis._common.backbone_of(model, "analyze")
    if kb.analysis._common.banded_attention(backbone):
        raise CommandError(f"--task {args.task} is a {manifest['family']} model: its "
                           "sliding-window attention has no (T, T) attention maps for analyze "
                           "(use kb.analysis.probe in Python).")
    _check_labels(args.texts, labels, numbers, model)
    os.makedirs(args.output, exist_ok=True)
    summary = {"task": args.task, "texts": len(texts), "family": manifest["family"]}

    print(f"attention maps of {len(texts)} texts")
    bar = keras.utils.Progbar(len(texts), unit_name="text")
    maps = kb.analysis.attention_maps(model, texts, tokenizer=tokenizer, progress=bar.update)
    np.savez_compressed(
        os.path.join(args.output, "attention_maps.npz"),
        **{f"text{i}_layer{l}": m for i, layers in enumerate(maps.maps)
           for l, m in enumerate(layers)})
    with open(os.path.join(args.output, "tokens.json"), "w") as f:
        json.dump(maps.tokens, f)
    layer, head = maps.num_layers - 1, 0
    if args.head:
        layer, head = (int(v) for v in args.head.split(","))  # checked: cli._check_analyze
    for i in range(min(args.plot_texts, len(texts))):
        kb.analysis.plot_attention(maps, os.path.join(args.output, f"attention_text{i}.png"), i)
        kb.analysis.plot_attention(
            maps, os.path.join(args.output, f"attention_text{i}_L{layer}_H{head}.png"), i,
            layer=layer, head=head)
    stats = maps.statistics()
    _write_heads_csv(os.path.join(args.output, "head_statistics.csv"), stats)
    for name in ("entropy", "to_cls", "to_sep", "to_punctuation", "to_previous", "to_next"):
        kb.analysis.plot_heads(stats[name], os.path.join(args.output, f"stat_{name}.png"),
                               title=f"{name} (Clark et al. 2019)", cmap="viridis")
    summary["statistics"] = {k: float(np.nanmean(v)) for k, v in stats.items()}

    takes_mask = isinstance(backbone, kb.models.backbone.EncoderBackbone)
    if args.importance and saved and hasattr(model, "losses_and_metrics") and takes_mask:
        if labels is None:
            labels = [int(v) for v in np.argmax(model.predict(texts, verbose=0), -1)]
            summary["labels"] = "the model's own predictions (no labels in --texts)"
        else:
            summary["labels"] = "from --texts"
        print("head importance (Michel et al. 2019)" + (
            " and the accuracy drop of each head" if args.accuracy_drop else ""))
        counts = kb.analysis._common.heads_per_layer(model.backbone)
        bar = keras.utils.Progbar(sum(counts) if args.accuracy_drop else 1, unit_name="pass")
        result = kb.analysis.head_importance(
            model, (texts, np.asarray(labels, "int32")), accuracy_drop=args.accuracy_drop,
            progress=bar.update)
        tables = {"importance": result.importance, "raw_importance": result.raw}
        if result.accuracy_drop is not None:
            tables[result.drop_name] = result.accuracy_drop
            kb.analysis.plot_heads(result.accuracy_drop,
                                   os.path.join(args.output, "accuracy_drop.png"),
                                   title=f"{result.drop_name.replace('_', ' ')} when masking "
                                         "one head",
                                   cmap="coolwarm", fmt=".3f")
        _write_heads_csv(os.path.join(args.output, "head_importance.csv"), tables)
        kb.analysis.plot_heads(result.importance,
                               os.path.join(args.output, "head_importance.png"),
                               title="head importance (per-layer L2 normalized)")
        summary["baseline_" + str(result.metric)] = result.baseline
    elif args.importance and not takes_mask:
        summary["importance"] = (f"skipped: the {manifest['family']} family takes no head mask "
                                 "(head importance works for the shared-encoder families)")
        print(f"head importance {summary['importance']}")
    elif args.importance:
        summary["importance"] = "skipped: a backbone preset has no task loss"
    with open(os.path.join(args.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {len(os.listdir(args.output))} files to {args.output}")
    return 0
