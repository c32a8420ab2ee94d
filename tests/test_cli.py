"""`keras-bertfam pretrain`: a run killed mid-way resumes from its last checkpoint, nothing lost."""
import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ARGS = ["pretrain", "--family", "bert", "--preset", "bert_tiny_en_uncased", "--steps", "6",
        "--checkpoint-every", "2", "--batch-size", "4", "--sequence-length", "32", "--no-export",
        "--deterministic", "--verbose", "0", "--seed", "7"]


def _run(output, **kwargs):
    cmd = [sys.executable, "-m", "keras_bertfam.cli", *ARGS, "--output", str(output)]
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


def _weights(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def _step(output):
    path = os.path.join(output, "training_state.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return json.load(f)["step"]


def test_killed_run_resumes_to_the_same_weights(tmp_path):
    reference = _run(tmp_path / "reference")
    interrupted = _run(tmp_path / "interrupted")
    deadline = time.time() + 600
    while _step(tmp_path / "interrupted") < 2:  # first checkpoint written
        assert interrupted.poll() is None, interrupted.stdout.read()
        assert time.time() < deadline
        time.sleep(0.2)
    interrupted.send_signal(signal.SIGKILL)
    interrupted.wait()
    assert _step(tmp_path / "interrupted") < 6, "killed too late to test a resume"

    resumed = _run(tmp_path / "interrupted")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert "Resuming from step" in out
    out, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, out

    assert _step(tmp_path / "interrupted") == _step(tmp_path / "reference") == 6
    a = _weights(tmp_path / "reference" / "checkpoint.weights.h5")
    b = _weights(tmp_path / "interrupted" / "checkpoint.weights.h5")
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    with open(tmp_path / "interrupted" / "training_state.json") as f:
        history = json.load(f)["history"]
    assert [h["step"] for h in history][-1] == 6


def test_bad_arguments():
    result = subprocess.run([sys.executable, "-m", "keras_bertfam.cli", "pretrain", "--steps",
                             "0", "--output", "/tmp/never"], capture_output=True, text=True)
    assert result.returncode != 0 and "--steps must be positive" in result.stderr
    result = subprocess.run([sys.executable, "-m", "keras_bertfam.cli", "pretrain", "--preset",
                             "bert_tiny_en_uncasd", "--output", "/tmp/never"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "bert_tiny_en_uncased" in result.stderr
