"""`keras-bertfam`: pretrain | presets (and export, once a model is trained).

`pretrain` trains in chunks of `--checkpoint-every` steps. After each chunk it writes the weights
and optimizer state, the dropout generators' state, then a small JSON with the step (last, so it
only ever names a complete checkpoint), each atomically (write, then rename): a run killed at any
moment resumes from the last finished chunk with nothing lost or corrupted.
Chunk c always sees the data and masks drawn from seed `seed + c`, so a resumed run repeats
exactly what the interrupted chunk would have done.
"""
import argparse
import json
import os
import sys
import time

# Arguments that name the objective each family pretrains with (kb.tasks class names).
PRETRAINERS = {
    "bert": "BertPretrainer",
    "roberta": "MaskedLM",
    "albert": "AlbertPretrainer",
    "electra": "ElectraPretrainer",
    "spanbert": "SpanBertPretrainer",
    "distil_bert": "MaskedLM",
    "xlnet": "XLNetPretrainer",
}
STATE_FILE = "training_state.json"
CHECKPOINT = "checkpoint.weights.h5"
RNG_STATE = "rng_state.npz"  # dropout seed generators: Keras' save_weights leaves them out


def _write_atomic(path, write):
    """write(tmp) then rename: a reader sees the old file or the new one, never half of one."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, "tmp-" + name)  # keeps the extension Keras checks
    write(tmp)
    os.replace(tmp, path)


def _rng_variables(task):
    return [v for v in task.non_trainable_variables if "seed_generator" in v.path]


def _save_rng(task, path):
    import keras
    import numpy as np

    with open(path, "wb") as f:
        np.savez(f, *[keras.ops.convert_to_numpy(v) for v in _rng_variables(task)])


def _load_rng(task, path):
    import numpy as np

    with np.load(path) as saved:
        for variable, name in zip(_rng_variables(task), saved.files):
            variable.assign(saved[name])


def _parser():
    parser = argparse.ArgumentParser(prog="keras-bertfam", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretrain", help="pretrain a model on a corpus, save a preset, export it")
    p.add_argument("--family", default="bert", choices=sorted(PRETRAINERS))
    p.add_argument("--preset", default="bert_tiny_en_uncased",
                   help="registered name or directory: gives the architecture and tokenizer")
    p.add_argument("--corpus", default=None,
                   help="file, directory, glob, TFRecords or tfds:NAME (default: IMDB reviews)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--output", required=True, help="directory for checkpoints, preset, export")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="default: 10%% of --steps")
    p.add_argument("--train-vocab", type=int, default=0, metavar="SIZE",
                   help="learn a WordPiece vocabulary of SIZE from the corpus (domain pretraining)")
    p.add_argument("--init-weights", action="store_true",
                   help="continue from the preset's weights instead of a random initialization")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="TensorFlow op determinism: bit-identical reruns (slower)")
    p.add_argument("--export", dest="export", action="store_true", default=True)
    p.add_argument("--no-export", dest="export", action="store_false")
    p.add_argument("--strategy", default=None,
                   help="mirrored | multi_worker | tpu | jax_data_parallel")
    p.add_argument("--verbose", type=int, default=1)

    e = sub.add_parser("export", help="export a saved preset directory as a TF Serving SavedModel")
    e.add_argument("--task", required=True, help="a preset directory saved by save_to_preset")
    e.add_argument("--output", required=True,
                   help="versioned export directory, e.g. models/my_model/1 (TF Serving's layout)")
    e.add_argument("--sequence-length", type=int, default=None)
    e.add_argument("--tf-text", default="2.12.1",
                   help="tf-text release of the target server for the op audit (2.12.1: TF "
                        "Serving 2.12-2.19; 2.20.0: 2.20 on)")

    s = sub.add_parser("presets", help="list the registered presets")
    s.add_argument("--family", default=None)

    from keras_bertfam.analysis.cli import add_analyze_parser  # kb.analysis owns `analyze`

    add_analyze_parser(sub)
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.command == "presets":
        import keras_bertfam as kb

        kb.presets.list(args.family)
        return 0
    if args.command == "pretrain":
        return pretrain(args)
    if args.command == "export":
        return export(args)
    if args.command == "analyze":
        from keras_bertfam.analysis.cli import analyze

        return analyze(args)
    return 1


# === pretrain ===
def _check_args(args):
    for name in ("steps", "checkpoint_every", "batch_size", "sequence_length"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive.")
    if args.warmup_steps is None:
        args.warmup_steps = args.steps // 10


def _tokenizer(args, kb):
    if not args.train_vocab:
        return kb.preprocessing.Tokenizer.from_preset(args.preset)
    vocab = os.path.join(args.output, "vocab.txt")
    if not os.path.exists(vocab):
        print(f"Training a {args.train_vocab}-token WordPiece vocabulary on the corpus ...")
        docs = kb.preprocessing.read_corpus(args.corpus).take(20000)
        kb.preprocessing.train_word_piece_vocabulary(docs, args.train_vocab, output_file=vocab)
    return kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)


def _build_task(args, kb, tokenizer):
    import keras

    name = PRETRAINERS[args.family]
    task_cls = getattr(kb.tasks, name, None)
    if task_cls is None:
        raise SystemExit(f"The {args.family} pretrainer ({name}) is not available in this version.")
    overrides = {}
    if args.family != "xlnet":  # XLNet's positions are relative: no max_sequence_length
        overrides["max_sequence_length"] = max(args.sequence_length, 8)
    if args.train_vocab:
        overrides["vocabulary_size"] = tokenizer.vocabulary_size()
    backbone = kb.presets.load_backbone(args.preset, load_weights=args.init_weights, **overrides)
    if backbone.family != args.family:
        raise SystemExit(f"--preset {args.preset} is a {backbone.family} model, not {args.family}.")
    preprocessor = task_cls.default_preprocessor(
        tokenizer, backbone, sequence_length=args.sequence_length, batch_size=args.batch_size,
        seed=args.seed)
    task = task_cls.pretraining_task(backbone, preprocessor)
    task.compile(learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                 total_steps=args.steps)
    task.optimizer.build(task.trainable_variables)
    return task


def _documents(args, kb, task, chunk):
    """The documents of chunk `chunk`, and the seed of their pairing and masking: a function of
    (seed, chunk) only, so a resumed run repeats the interrupted chunk exactly. (No global
    reseeding here: every random draw of the data takes an explicit seed, dropout's state is in
    the checkpoint, and keras.utils.set_random_seed would drop tf-text's SentencePiece resource.)"""
    task.preprocessor.seed = args.seed + chunk
    docs = kb.preprocessing.read_corpus(args.corpus)
    return docs.shuffle(4096, seed=args.seed + chunk).repeat()


def pretrain(args):
    _check_args(args)
    os.makedirs(args.output, exist_ok=True)
    import keras

    import keras_bertfam as kb

    keras.utils.set_random_seed(args.seed)
    if args.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    strategy = None
    if args.strategy:
        from keras_bertfam import distribute

        strategy = distribute.get_strategy(args.strategy)
    scope = strategy.scope() if strategy is not None and hasattr(strategy, "scope") else _null()
    tokenizer = _tokenizer(args, kb)
    with scope:
        task = _build_task(args, kb, tokenizer)

    state_path = os.path.join(args.output, STATE_FILE)
    checkpoint = os.path.join(args.output, CHECKPOINT)
    step = 0
    if os.path.exists(state_path):
        with open(state_path) as f:
            state = json.load(f)
        if state.get("args", {}).get("preset") != args.preset:
            raise SystemExit(f"{args.output} holds a run of another preset; use a new --output.")
        task.load_weights(checkpoint)
        _load_rng(task, os.path.join(args.output, RNG_STATE))
        step = state["step"]
        print(f"Resuming from step {step} ({checkpoint}).")

    chunks = -(-args.steps // args.checkpoint_every)
    history = []
    start = time.time()
    for chunk in range(step // args.checkpoint_every, chunks):
        steps = min(args.checkpoint_every, args.steps - chunk * args.checkpoint_every)
        docs = _documents(args, kb, task, chunk)
        result = task.fit(docs, epochs=chunk + 1, initial_epoch=chunk, steps_per_epoch=steps,
                          verbose=args.verbose)
        step = chunk * args.checkpoint_every + steps
        history.append({"step": step, **{k: float(v[-1]) for k, v in result.history.items()}})
        _write_atomic(checkpoint, task.save_weights)
        _write_atomic(os.path.join(args.output, RNG_STATE), lambda p: _save_rng(task, p))
        _write_atomic(state_path, lambda p: _dump(p, {"step": step, "args": vars(args),
                                                      "history": history}))
    elapsed = time.time() - start

    preset_dir = os.path.join(args.output, "preset")
    task.save_to_preset(preset_dir)
    print(f"Trained {args.steps} steps in {elapsed:.0f} s. Preset: {preset_dir}")
    if args.export:
        export_dir = os.path.join(args.output, "export", "1")
        kb.export.export_saved_model(task.backbone, export_dir, preprocessor=task.preprocessor)
        print(f"SavedModel (serving_default takes strings): {export_dir}")
    return 0


def export(args):
    """Loads a preset directory under TensorFlow and writes a SavedModel (works for models
    trained under any backend: the preset's weights are backend-neutral)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras_bertfam as kb
    from keras_bertfam import presets

    manifest = presets._read_manifest(args.task)
    task = manifest.get("task")
    if task:
        model = getattr(kb.tasks, task["class_name"]).from_preset(args.task, **task["config"])
        tokenizer = None
    else:
        model = presets.load_backbone(args.task)
        tokenizer = presets.load_tokenizer(args.task)
    names = kb.export.export_saved_model(model, args.output, sequence_length=args.sequence_length,
                                         tokenizer=tokenizer)
    report = kb.export.audit_ops(args.output, tf_text=args.tf_text)
    text_ops = sorted(op for op, kind in report["ops"].items() if kind == "tf-text")
    print(f"SavedModel: {args.output} (signatures {', '.join(names)}); {len(report['ops'])} op "
          f"types, all core TensorFlow or tf-text {args.tf_text} ({', '.join(text_ops)}).")
    return 0


def _dump(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
