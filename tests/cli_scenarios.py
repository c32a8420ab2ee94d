"""Runs the `keras-bertfam pretrain` scenarios of tests/test_cli.py in ONE process (TensorFlow is
imported and the graph libraries loaded once) and writes what the tests assert to a JSON file.

    python tests/cli_scenarios.py WORKDIR KILLED_DIR PRESET_DIR

WORKDIR receives every run's output directory; KILLED_DIR is the output of a run that the test
killed (os._exit, as kill -9) at a file boundary of a checkpoint write, resumed here; PRESET_DIR
the runs' --preset (`make_preset`).
The first call goes through the console script (keras_bertfam_cli), so that TensorFlow is imported
the way `keras-bertfam` imports it: the test checks this process's stderr for log lines.

The runs read a small corpus (tests/cli_corpus.txt, 24 documents) instead of the default one: each
checkpoint chunk starts a new data stream, and filling its 4,096-document shuffle buffer from the
25,000 IMDB reviews cost ~0.8 s of CPU a chunk (11 chunks here and in the killed run); what these
scenarios check does not depend on the text.
"""
import contextlib
import io
import json
import os
import shutil
import sys

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_corpus.txt")


def pretrain_args(preset):
    """The scenarios' `keras-bertfam pretrain` arguments, but --output."""
    return ["pretrain", "--family", "bert", "--preset", preset, "--steps", "6",
            "--checkpoint-every", "2", "--batch-size", "2", "--sequence-length", "16",
            "--deterministic", "--seed", "7", "--corpus", CORPUS]


def make_preset(path):
    """The scenarios' --preset: a preset directory of a one-layer, 16-wide BERT with
    bert_tiny_en_uncased's vocabulary (a directory is what `--preset` also takes). What the
    scenarios check (checkpoints, resumes, signals, exports) does not depend on the model's
    size; bert_tiny_en_uncased's two 128-wide layers made every run trace a second layer and
    every checkpoint ~50 MB (the scenarios copy whole run directories a dozen times)."""
    import keras_bertfam as kb

    tokenizer = kb.preprocessing.Tokenizer.from_preset("bert_tiny_en_uncased")
    backbone = kb.models.BertBackbone(tokenizer.vocabulary_size(), 1, 2, 16, 32,
                                      max_sequence_length=16)
    kb.presets.save_backbone(backbone, path, tokenizer=tokenizer)
    return path


def call(argv, env=None):
    """main(argv) -> (exit status, stdout, stderr), with `env` set during the call."""
    import keras_bertfam_cli

    out, err = io.StringIO(), io.StringIO()
    env = env or {}
    for k, v in env.items():
        os.environ[k] = v
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = keras_bertfam_cli.main(argv)
            except SystemExit as e:
                status = e.code
    finally:
        for k in env:
            os.environ.pop(k, None)
    return status, out.getvalue(), err.getvalue()


def final_arrays(output):
    """Every array of the newest checkpoint: weights, optimizer state, RNG state (the seed
    generators' state is in the weights file; an older checkpoint's rng_state.npz is read too)."""
    import h5py
    import numpy as np

    from keras_bertfam.run_directory import RunDirectory

    step, where = RunDirectory(output).latest(["model.weights.h5"])
    arrays = {}
    with h5py.File(os.path.join(where, "model.weights.h5"), "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    if os.path.exists(os.path.join(where, "rng_state.npz")):
        with np.load(os.path.join(where, "rng_state.npz")) as rng:
            arrays.update({f"rng/{k}": rng[k] for k in rng.files})
    return step, arrays


def differences(a, b):
    import numpy as np

    (step_a, a), (step_b, b) = a, b
    if step_a != step_b:
        return [f"steps {step_a} != {step_b}"]
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(set(a) ^ set(b))[:5]}"]
    return [k for k in a if not np.array_equal(a[k], b[k])]


def state(output):
    from keras_bertfam.run_directory import RunDirectory

    _, where = RunDirectory(output).latest(["training_state.json"])
    with open(os.path.join(where, "training_state.json")) as f:
        return json.load(f)


def temporaries(output):
    return sorted(os.path.relpath(os.path.join(root, name), output)
                  for root, dirs, files in os.walk(output) for name in dirs + files
                  if name.startswith("tmp-"))


def rewrite_manifest(where, names=None):
    """The manifest of the checkpoint directory `where` rewritten with the sizes and sums its
    files (`names`; by default the ones it lists) have now."""
    from keras_bertfam import run_directory

    path = os.path.join(where, run_directory.MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    manifest["files"] = {n: {"bytes": os.path.getsize(os.path.join(where, n)),
                             "sha256": run_directory.sha256(os.path.join(where, n))}
                         for n in (names or manifest["files"])}
    with open(path, "w") as f:
        json.dump(manifest, f)


def older_layout(where, argv):
    """The checkpoint in `where` rewritten as checkpoints were before model.weights.h5 held the
    seed generators' state (session 31) and while rng_state.npz held it (until session 32):
    those states moved out of the weights file into rng_state.npz (`{"step", "rng_<i>"}` in
    the order of `cli._rng_variables`, as `_save_rng` wrote it), the manifest rewritten.
    -> the names of the states moved."""
    import h5py
    import numpy as np

    import keras_bertfam as kb
    from keras_bertfam import cli, run_directory

    args = cli._parser().parse_args(argv)
    cli._check_args(args)
    task = cli._build_task(args, kb, kb.preprocessing.Tokenizer.from_preset(args.preset))
    weights = os.path.join(where, "model.weights.h5")
    task.load_weights(weights)
    with open(os.path.join(where, run_directory.MANIFEST)) as f:
        manifest = json.load(f)
    rng = {f"rng_{i}": v.numpy() for i, v in enumerate(cli._rng_variables(task))}
    with open(os.path.join(where, "rng_state.npz"), "wb") as f:
        np.savez(f, step=np.int64(manifest["step"]), **rng)
    with h5py.File(weights, "r+") as f:
        moved = sorted(k for k in f["vars"] if k.startswith("seed_generator_"))
        for k in moved:
            del f["vars"][k]
    rewrite_manifest(where, ("model.weights.h5", "rng_state.npz", "training_state.json"))
    return {"moved": moved, "rng": sorted(rng)}


def main(work, killed, preset):
    ARGS = pretrain_args(preset)
    results = {}
    out = lambda name: os.path.join(work, name)  # noqa: E731

    # Quiet console script: the test checks this process's stderr.
    status, stdout, stderr = call(["presets"])
    results["presets"] = {"status": status, "stdout": stdout, "stderr": stderr}

    from keras_bertfam import run_directory

    # 1. The uninterrupted reference, snapshotting the directory at every file boundary of the
    #    step-4 checkpoint write (the on-disk state a kill -9 right there leaves).
    #    (Byte copies, not hard links: a link would follow a file later changed in place, the
    #    very defect a snapshot must show.)
    snapshots = []

    def snapshot(n, step, label):
        if step == 4:
            dest = out(f"snapshot-{len(snapshots)}")
            shutil.copytree(out("reference"), dest, symlinks=True)
            snapshots.append({"dir": dest, "label": label})

    run_directory.boundary_hook = snapshot
    status, stdout, stderr = call([*ARGS, "--output", out("reference")])
    run_directory.boundary_hook = None
    reference = final_arrays(out("reference"))
    results["reference"] = {"status": status, "stdout": stdout, "stderr": stderr,
                            "state": state(out("reference")), "temporaries":
                            temporaries(out("reference")),
                            "products": json.load(open(out("reference/products.json")))}

    # 2. Each snapshot: which checkpoint a resume starts from, after removing temporaries;
    #    the checkpoint's files byte-identical to the reference's of that step.
    per_boundary = []
    for snap in snapshots:
        copy = snap["dir"] + "-opened"
        shutil.copytree(snap["dir"], copy, symlinks=True)
        with run_directory.RunDirectory(copy) as run:
            step, where = run.latest(["model.weights.h5", "training_state.json"])
            # latest() has verified every file against its manifest's sha256: those sums
            with open(os.path.join(where, run_directory.MANIFEST)) as f:
                files = json.load(f)["files"]
            sums = {n: files[n]["sha256"]
                    for n in ("model.weights.h5", "training_state.json")}
            left = [t for t in temporaries(copy)]
        per_boundary.append({"label": snap["label"], "step": step, "sha256": sums,
                             "temporaries": left})
    results["boundaries"] = per_boundary

    # 3. A full resume of the killed run (kill -9 between the rename of step-4 and the removal of
    #    step-2); 4. resumes from the snapshot taken after the second file of step-4. (No export:
    #    a resumed run's export is the continued run's, 6.) The NaN run (5) starts from a copy of
    #    the killed run's directory (a real copy: a resume rewrites the .lock in place).
    nan_dir = out("nan")
    shutil.copytree(killed, nan_dir)
    status, stdout, stderr = call([*ARGS, "--output", killed, "--no-export"])
    results["killed_resume"] = {"status": status, "stdout": stdout, "stderr": stderr,
                                "differences": differences(final_arrays(killed), reference),
                                "state": state(killed)}
    # 4. From the second snapshot (a kill after writing step-4's second file: the resume starts
    #    from step-2): SIGTERM at step 3 (inside a chunk), then resume to the end.
    signalled = snapshots[1]["dir"]
    status, stdout, stderr = call([*ARGS, "--output", signalled, "--no-export"],
                                  env={"KERAS_BERTFAM_TEST_SIGNAL_AT_STEP": "3:TERM"})
    results["sigterm"] = {"status": status, "stdout": stdout, "stderr": stderr,
                          "state": state(signalled), "temporaries": temporaries(signalled),
                          "entries": sorted(os.listdir(signalled))}
    status, stdout, stderr = call([*ARGS, "--output", signalled, "--no-export"])
    results["sigterm_resume"] = {"status": status, "stdout": stdout, "stderr": stderr,
                                 "differences": differences(final_arrays(signalled), reference),
                                 "state": state(signalled)}

    # 5. NaN: from step 4 (the killed run's), poisoned weights after step 5 -> a NaN loss at step
    #    6; step-4 stays.
    status, stdout, stderr = call([*ARGS, "--output", nan_dir, "--no-export"],
                                  env={"KERAS_BERTFAM_TEST_NAN_AT_STEP": "5"})
    results["nan"] = {"status": status, "stdout": stdout, "stderr": stderr,
                      "state": state(nan_dir), "entries": sorted(os.listdir(nan_dir)),
                      "temporaries": temporaries(nan_dir)}

    # 6. `make pretrain` twice: a no-op; then a larger --steps continues and exports version 2.
    status, stdout, stderr = call([*ARGS, "--output", out("reference")])
    results["rerun"] = {"status": status, "stdout": stdout, "stderr": stderr}
    continued = out("continued")
    shutil.copytree(out("reference"), continued)
    argv = list(ARGS)
    argv[argv.index("--steps") + 1] = "8"
    status, stdout, stderr = call([*argv, "--output", continued])
    results["continued"] = {"status": status, "stdout": stdout, "stderr": stderr,
                            "state": state(continued),
                            "exports": sorted(os.listdir(os.path.join(continued, "export"))),
                            "products": json.load(open(os.path.join(continued,
                                                                    "products.json")))}

    # 6b. A checkpoint of the older layout (rng_state.npz, the weights file without the seed
    #     generators' state): step 4 of the snapshot after step-2's removal, resumed to 6.
    older = out("older")
    shutil.copytree(snapshots[-1]["dir"], older, symlinks=True)
    moved = older_layout(os.path.join(older, "checkpoints", "step-4"),
                         [*ARGS, "--output", older])
    status, stdout, stderr = call([*ARGS, "--output", older, "--no-export"])
    results["older_layout"] = dict(moved, status=status, stdout=stdout, stderr=stderr,
                                   label=snapshots[-1]["label"],
                                   differences=differences(final_arrays(older), reference))

    # 7. `keras-bertfam export` of the reference preset (next free version) against the
    #    SavedModel pretrain wrote: the same signatures and the same numbers.
    status, stdout, stderr = call(["export", "--task", out("reference/preset"), "--no-audit"])
    results["export"] = {"status": status, "stdout": stdout, "stderr": stderr}
    import numpy as np
    import tensorflow as tf

    signatures = {}
    texts = tf.constant(["the movie was great", "a dull film"])
    values = {}
    for version in ("1", "2"):
        model = tf.saved_model.load(out(f"reference/export/{version}"))
        fn = model.signatures["serving_default"]
        signatures[version] = {"inputs": sorted(fn.structured_input_signature[1]),
                               "outputs": sorted(fn.structured_outputs)}
        values[version] = {k: np.asarray(v) for k, v in fn(text=texts).items()}
    results["signatures"] = signatures
    results["signature_values_equal"] = all(
        np.array_equal(values["1"][k], values["2"][k]) for k in values["1"])

    # 8. `keras-bertfam export --heads` of the reference preset: its pretraining heads served.
    status, stdout, stderr = call(["export", "--task", out("reference/preset"), "--output",
                                   out("m"), "--heads", "--no-audit"])
    fn = tf.saved_model.load(out("m/1")).signatures["serving_default"] if status == 0 else None
    results["heads"] = {"status": status, "stdout": stdout, "stderr": stderr,
                        "inputs": fn and sorted(fn.structured_input_signature[1])}

    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    # Keras imports scikit-learn, pandas and matplotlib when they are installed, TensorFlow JAX;
    # these scenarios use none of them (~2.5 s of CPU less). main(argv), called here, leaves a
    # caller's imports alone; the killed run (test_cli) starts as the console script does, which
    # skips all but matplotlib (`keras_bertfam_cli.main`), and its stderr is checked too.
    sys.modules.update(dict.fromkeys(("sklearn", "pandas", "matplotlib", "jax")))
    main(sys.argv[1], sys.argv[2], sys.argv[3])
