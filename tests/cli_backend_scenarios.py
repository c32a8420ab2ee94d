"""The kill / resume scenarios of tests/cli_scenarios.py on the backend of KERAS_BACKEND (JAX or
PyTorch), in ONE process, writing what the test asserts to WORKDIR/results.json:

    KERAS_BACKEND=jax python tests/cli_backend_scenarios.py WORKDIR

1. The uninterrupted 6-step `--deterministic` reference, the directory copied at every file
   boundary of every checkpoint write (steps 2, 4 and 6): the on-disk state a kill -9 right
   there leaves (`run_directory.boundary_hook`, the points KERAS_BERTFAM_TEST_EXIT_AT_BOUNDARY
   kills at; the checkpoint's files are fsync'ed before each).
2. Each copy opened as a resume opens it: the checkpoint it starts from (step and sha256s) and
   what is left of the kill's temporaries.
3. Resumed to the end, bit for bit as the reference: one copy of each checkpoint a kill can
   leave behind (step-2, step-4; copies that start from the same checkpoint hold the same bytes,
   2.); the first from step-2 stopped by SIGTERM at step 3 (inside a chunk) and resumed.
4. A checkpoint another backend wrote (its record rewritten) resumed: the run says so.
"""
import json
import os
import shutil
import sys

from cli_scenarios import (call, differences, final_arrays, make_preset, pretrain_args,
                           rewrite_manifest, state, temporaries)


def main(work):
    from keras_bertfam import run_directory

    args = [*pretrain_args(make_preset(os.path.join(work, "preset"))), "--no-export"]
    out = lambda name: os.path.join(work, name)  # noqa: E731
    results = {}

    snapshots = []

    def snapshot(n, step, label):
        dest = out(f"snapshot-{n}")
        shutil.copytree(out("reference"), dest, symlinks=True)
        snapshots.append({"n": n, "dir": dest, "step": step, "label": label})

    run_directory.boundary_hook = snapshot
    try:
        status, stdout, stderr = call([*args, "--output", out("reference")])
    finally:
        run_directory.boundary_hook = None
    reference = final_arrays(out("reference"))
    results["reference"] = {"status": status, "stdout": stdout, "stderr": stderr,
                            "state": state(out("reference"))}

    boundaries = []
    for snap in snapshots:
        with run_directory.RunDirectory(snap["dir"]) as run:
            latest = run.latest(["model.weights.h5", "training_state.json"])
            sums = None
            if latest is not None:
                with open(os.path.join(latest[1], run_directory.MANIFEST)) as f:
                    sums = {n: e["sha256"] for n, e in json.load(f)["files"].items()}
            boundaries.append({"n": snap["n"], "writing": snap["step"], "label": snap["label"],
                               "resumes_from": latest and latest[0], "sha256": sums,
                               "temporaries": temporaries(snap["dir"])})
    results["boundaries"] = boundaries

    def resume(snap, name, env=None):
        status, stdout, stderr = call([*args, "--output", snap["dir"]], env=env)
        results[name] = {"status": status, "stdout": stdout, "stderr": stderr,
                         "state": state(snap["dir"]), "entries": sorted(os.listdir(snap["dir"])),
                         "differences": differences(final_arrays(snap["dir"]), reference)}

    first = {}  # resume step -> the first boundary's snapshot that leaves it
    for snap, b in zip(snapshots, boundaries):
        if b["resumes_from"] is not None:
            first.setdefault(b["resumes_from"], snap)
    resume(first[2], "killed_resume_2", env={"KERAS_BERTFAM_TEST_SIGNAL_AT_STEP": "3:TERM"})
    results["sigterm"] = results.pop("killed_resume_2")
    resume(first[2], "sigterm_resume")
    resume(first[4], "killed_resume_4")
    # 4. A step-4 checkpoint whose training_state.json says TensorFlow trained it (the manifest's
    #    sums rewritten): resumed here, it says so; the state itself is this backend's.
    other = [s for s, b in zip(snapshots, boundaries) if b["resumes_from"] == 4][-1]
    where = os.path.join(other["dir"], run_directory.CHECKPOINTS, "step-4")
    record = state(other["dir"])
    record["sessions"][-1]["backend"] = "tensorflow"
    with open(os.path.join(where, "training_state.json"), "w") as f:
        json.dump(record, f)
    rewrite_manifest(where)
    resume(other, "other_backend_resume")
    with open(out("results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    # Keras imports scikit-learn and pandas when they are installed; these scenarios use neither.
    sys.modules.update(dict.fromkeys(("sklearn", "pandas", "matplotlib")))
    main(sys.argv[1])
