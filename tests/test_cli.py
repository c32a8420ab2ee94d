"""`keras-bertfam`: checkpoints that cannot be half-written, resumes that are bit-identical or
refused with a reason, a locked output directory, signals, the NaN guard, reruns, export versions,
a quiet and fast console script.

The training scenarios run in two processes (tests/cli_scenarios.py runs most of them in one, so
TensorFlow and the training graph libraries load once; `export --heads` runs there too, after
three other exports); the checks that need no training run in this process on copies of their
output.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from keras_bertfam import cli, run_directory

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cli_scenarios import make_preset, pretrain_args  # noqa: E402


EXIT_BOUNDARY = 8  # step-2: 2 files, manifest, rename (4); step-4: 2 files, manifest, RENAME
TF_LOG_MARKERS = ("I0000", "W0000", "E0000", "absl::InitializeLog", "cuInit", "cudart_stub",
                  "oneDNN", "TF-TRT")


def _env():
    """The environment of a user's shell: conftest's TF_CPP_MIN_LOG_LEVEL=2 is not in it (a user
    who sets it asks for TensorFlow's ERROR lines, and gets them: on some CPUs a train step logs
    oneDNN's "supports DT_INT64 only on platforms with AVX-512" at ERROR level), so the CLI's own
    quieting is what runs."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The scenarios' results, computed once per test run (under pytest-xdist, the first worker
    computes them and the others wait and read them: the shared-fixture pattern of its docs)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _run_scenarios(tmp_path_factory.mktemp("cli"))
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent / "cli-scenarios"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "done.json").exists():
            results = _run_scenarios(shared)
            (shared / "done.json").write_text(json.dumps(results))
        return json.loads((shared / "done.json").read_text())


def _run_scenarios(work):
    """Kills a run (os._exit, as kill -9) at the file boundary between renaming its step-4
    checkpoint into place and removing step-2, then runs tests/cli_scenarios.py. Every run's
    --preset: a small preset directory (`make_preset`)."""
    preset = make_preset(str(work / "preset"))
    killed = work / "killed"
    cmd = [sys.executable, "-m", "keras_bertfam_cli", *pretrain_args(preset), "--output",
           str(killed)]
    env = dict(_env(), KERAS_BERTFAM_TEST_EXIT_AT_BOUNDARY=str(EXIT_BOUNDARY))
    kill = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    driver = subprocess.run([sys.executable, os.path.join(HERE, "cli_scenarios.py"), str(work),
                             str(killed), preset], env=_env(), capture_output=True, text=True,
                            timeout=3600)
    assert driver.returncode == 0, driver.stderr[-5000:]
    with open(work / "results.json") as f:
        results = json.load(f)
    results["kill"] = {"status": kill.returncode, "stdout": kill.stdout, "stderr": kill.stderr}
    results["work"] = str(work)
    results["args"] = pretrain_args(preset)  # the runs' arguments, but --output
    results["driver_stderr"] = driver.stderr  # TensorFlow's C++ lines would land here (fd 2)
    return results


# === Checkpoints: one atomic unit, verified on resume ===
def test_kill_at_every_checkpoint_file_boundary_resumes_from_a_complete_checkpoint(scenarios):
    boundaries = scenarios["boundaries"]
    labels = [b["label"] for b in boundaries]
    assert labels == ["wrote model.weights.h5", "wrote training_state.json", "wrote manifest.json",
                      "renamed to step-4", "renamed step-2 for removal", "removed step-2"]
    assert [b["step"] for b in boundaries] == [2, 2, 2, 4, 4, 4]
    for b in boundaries:
        assert b["temporaries"] == [], b  # a resume starts by removing what the kill left
    # the checkpoint a resume starts from is byte-identical to the uninterrupted run's
    for step in (2, 4):
        sums = [json.dumps(b["sha256"], sort_keys=True) for b in boundaries if b["step"] == step]
        assert len(set(sums)) == 1
    assert boundaries[0]["sha256"] != boundaries[-1]["sha256"]


def test_killed_runs_resume_bit_identically(scenarios):
    kill = scenarios["kill"]
    assert kill["status"] == 137 and "Checkpoint: step 2" in kill["stdout"], kill
    resumed = scenarios["killed_resume"]
    assert resumed["status"] == 0, resumed["stderr"]
    assert "Resuming from step 4" in resumed["stdout"]
    assert resumed["differences"] == []  # weights, optimizer, RNG of the uninterrupted run
    # (a kill after the second file of step-4: test_sigterm_... resumes it from step-2)


def test_resume_keeps_the_whole_history_and_reports_both_counts(scenarios):
    reference = scenarios["reference"]
    assert reference["status"] == 0, reference["stderr"]
    assert [h["step"] for h in reference["state"]["history"]] == [2, 4, 6]
    assert "Trained 6 steps in this run (0 -> 6)" in reference["stdout"]
    assert "6 steps in total" in reference["stdout"]
    resumed = scenarios["killed_resume"]
    assert [h["step"] for h in resumed["state"]["history"]] == [2, 4, 6]
    assert [(s["from_step"], s["to_step"]) for s in resumed["state"]["sessions"]] == [(0, 4),
                                                                                      (4, 6)]
    assert "Trained 2 steps in this run (4 -> 6)" in resumed["stdout"]
    assert "6 steps in total" in resumed["stdout"]
    assert reference["temporaries"] == []


def test_sigterm_stops_at_the_step_checkpoints_and_resumes_bit_identically(scenarios):
    stopped = scenarios["sigterm"]
    assert stopped["status"] == 128 + 15, stopped
    assert "Stopped by SIGTERM at step 3" in stopped["stdout"]
    assert stopped["state"]["step"] == 3
    assert stopped["temporaries"] == [] and ".lock" not in stopped["entries"]
    assert "preset" not in stopped["entries"]
    resumed = scenarios["sigterm_resume"]
    assert resumed["status"] == 0, resumed["stderr"]
    assert "Resuming from step 3" in resumed["stdout"]
    assert "Resuming from step 2" in stopped["stdout"]  # the kill-at-a-boundary snapshot
    assert resumed["differences"] == []  # inside a chunk: its batches skipped to step 3
    assert [h["step"] for h in resumed["state"]["history"]] == [2, 3, 4, 6]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(scenarios):
    nan = scenarios["nan"]
    assert nan["status"] == 1
    assert "The loss became nan at step 6" in nan["stderr"], nan
    assert "last good checkpoint is kept (step 4:" in nan["stderr"]
    assert "Traceback" not in nan["stderr"]
    assert nan["state"]["step"] == 4
    assert "preset" not in nan["entries"] and nan["temporaries"] == []


# === #12: reruns, export versions, one default signature ===
def test_rerunning_a_finished_run_is_a_no_op_and_a_larger_steps_continues(scenarios):
    rerun = scenarios["rerun"]
    assert rerun["status"] == 0, rerun["stderr"]
    assert rerun["stdout"].startswith("Nothing to do:"), rerun["stdout"]
    continued = scenarios["continued"]
    assert continued["status"] == 0, continued["stderr"]
    assert "Trained 2 steps in this run (6 -> 8)" in continued["stdout"]
    assert continued["state"]["step"] == 8
    assert [h["step"] for h in continued["state"]["history"]] == [2, 4, 6, 8]
    assert continued["exports"] == ["1", "2"]
    assert continued["products"]["export"]["path"].endswith(os.path.join("export", "2"))


def test_pretrain_and_export_write_the_same_default_signature(scenarios):
    assert scenarios["export"]["status"] == 0, scenarios["export"]["stderr"]
    assert "export/2 (encoder" in scenarios["export"]["stdout"]
    one, two = scenarios["signatures"]["1"], scenarios["signatures"]["2"]
    assert one == two and one["inputs"] == ["text"]
    assert {"sequence_output", "pooled_output"} <= set(one["outputs"])
    assert scenarios["signature_values_equal"]


def test_export_into_an_existing_version_says_what_to_do(scenarios, capsys):
    preset = os.path.join(scenarios["work"], "reference", "preset")
    export = os.path.join(scenarios["work"], "reference", "export")
    assert cli.main(["export", "--task", preset, "--output", os.path.join(export, "1")]) == 1
    err = capsys.readouterr().err
    assert "exists already" in err and f"--output {export}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_export_heads_flag_serves_the_pretraining_heads(scenarios):
    heads = scenarios["heads"]  # export --heads of the reference preset, then loaded
    assert heads["status"] == 0, heads["stderr"]
    assert "m/1 (pretraining heads" in heads["stdout"]
    assert heads["inputs"] == ["text_a", "text_b"]


def test_export_refuses_the_no_answer_flags_for_another_task(scenarios, capsys):
    """--handle-impossible-answer / --null-score-diff-threshold set a QuestionAnswerer's string
    signature: a pretraining preset (with or without --heads) refuses them in one line naming
    the flag, the preset's task and what is expected, before anything is written (a
    QuestionAnswerer's export with them and the other refusals: test_finetuning)."""
    preset = os.path.join(scenarios["work"], "reference", "preset")
    export = os.path.join(scenarios["work"], "reference", "export")
    versions = sorted(os.listdir(export))
    for extra in ([], ["--heads"]):
        assert cli.main(["export", "--task", preset, *extra, "--handle-impossible-answer",
                         "--null-score-diff-threshold", "0.5"]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert (f"--handle-impossible-answer sets a QuestionAnswerer's string signature (SQuAD "
                f'2.0\'s "no answer"); --task {preset} holds a BertPretrainer') in err, err
        assert err.strip().endswith(": expected a QuestionAnswerer preset."), err
    assert "(exported with --heads: its pretraining heads)" in err
    assert sorted(os.listdir(export)) == versions


def test_console_script_is_quiet(scenarios):
    presets = scenarios["presets"]
    assert presets["status"] == 0
    assert "bert_tiny_en_uncased" in presets["stdout"] and "offline" in presets["stdout"]
    # all_minilm_l6_v2: weights and vocabulary from the installed package
    line = next(l for l in presets["stdout"].splitlines() if l.startswith("all_minilm_l6_v2"))
    assert " offline offline " in " ".join(line.split()), line
    for output in (scenarios["driver_stderr"], presets["stderr"], scenarios["kill"]["stderr"]):
        assert not [m for m in TF_LOG_MARKERS if m in output], output[:2000]


def test_help_does_not_import_tensorflow():
    code = ("import sys, keras_bertfam_cli\n"
            "try:\n    keras_bertfam_cli.main(['pretrain', '--help'])\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'jax', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[]"), result.stdout
    assert "--heads" in result.stdout and "serving_default" in result.stdout
    # `python -m keras_bertfam.cli` likewise (every import listed by -X importtime).
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "keras_bertfam.cli",
                             "export", "--help"], env=_env(), capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--heads" in result.stdout
    # the QuestionAnswerer's options say what they do
    help_text = " ".join(result.stdout.split())
    assert "--handle-impossible-answer a QuestionAnswerer preset (SQuAD 2.0): the string " \
           'signature answers "" (answer_start = answer_end = -1) where' in help_text, help_text
    assert "--null-score-diff-threshold FLOAT with --handle-impossible-answer: by how much the " \
           "null score must beat the best span's score" in help_text, help_text
    imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "keras_bertfam.cli" in imported or "keras_bertfam" in imported, result.stderr[-2000:]
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras", "jax", "torch")]


# === Resume checks that need no training (this process, on copies of the runs) ===
def _copy(scenarios, tmp_path, name="reference"):
    """A copy of a run's directory: its checkpoints copied (tests damage their files in place), the
    rest (the preset and the SavedModels, ~100 MB that nothing here writes) hard-linked."""
    source, dest = os.path.join(scenarios["work"], name), tmp_path / name
    shutil.copytree(source, dest, copy_function=_link_or_copy,
                    ignore=lambda where, names: ["checkpoints"] if where == source else [])
    shutil.copytree(os.path.join(source, "checkpoints"), dest / "checkpoints")
    return dest


def _link_or_copy(source, dest):
    try:
        os.link(source, dest)
    except OSError:  # another file system
        shutil.copy2(source, dest)


def _pretrain(capsys, args, output, *extra):
    """`keras-bertfam pretrain` in this process: `args` (the scenarios' `args`) with `output`
    and `extra`. -> (exit status, stderr)."""
    argv = [*args, "--output", str(output), *extra]
    for flag in extra[::2]:  # replace an argument given again
        if flag in args:
            i = argv.index(flag)
            del argv[i:i + 2]
    status = cli.main(argv)
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize("flag,value", [("--sequence-length", "32"), ("--checkpoint-every", "3"),
                                        ("--batch-size", "4"), ("--preset", "bert_mini_en_uncased"),
                                        ("--seed", "8")])
def test_resume_with_changed_arguments_is_refused(scenarios, tmp_path, capsys, flag, value):
    output = _copy(scenarios, tmp_path)
    status, err = _pretrain(capsys, scenarios["args"], output, flag, value)
    assert status == 1
    assert f"{flag} {value} (the checkpoints: " in err.replace("'", ""), err
    assert "other arguments" in err and "Traceback" not in err


def test_resume_with_another_family_is_refused(scenarios, tmp_path, capsys):
    output = _copy(scenarios, tmp_path)
    status, err = _pretrain(capsys, scenarios["args"], output, "--family", "roberta")
    assert status == 1 and "--family 'roberta' (the checkpoint's: 'bert')" in err


def test_group_by_length_is_used_and_must_match_to_resume(scenarios, tmp_path, capsys):
    """--group-by-length changes which examples share a batch: a run resumes only with the
    checkpoint's choice, and a checkpoint written before the flag existed ran without it."""
    output = _copy(scenarios, tmp_path)
    status, err = _pretrain(capsys, scenarios["args"], output, "--group-by-length")
    assert status == 1 and "--group-by-length True (the checkpoint's: False)" in err, err
    args = cli._parser().parse_args([*scenarios["args"], "--output", str(output)])
    cli._check_args(args)
    older = {k: v for k, v in cli._resume_args(args).items() if k != "group_by_length"}
    cli._check_resume(args, {"step": 6, "args": older}, "training_state.json")
    args.group_by_length = True
    with pytest.raises(cli.CommandError, match=r"--group-by-length True \(the checkpoint's"):
        cli._check_resume(args, {"step": 6, "args": older}, "training_state.json")
    import keras_bertfam as kb

    tokenizer = kb.preprocessing.Tokenizer.from_preset("bert_tiny_en_uncased")
    assert cli._build_task(args, kb, tokenizer).preprocessor.group_by_length


def test_a_checkpoint_of_the_older_layout_resumes_bit_identically(scenarios):
    """Checkpoints hold `model.weights.h5` (weights, optimizer and the seed generators' state)
    and `training_state.json`; until session 32 they also held `rng_state.npz`, the seed
    generators' state again, which before session 31 `model.weights.h5` did not hold. Such a
    checkpoint (made by the scenarios from the reference's step 4: the seed generators' state
    moved out of the weights file into rng_state.npz, as those runs wrote it, the manifest
    rewritten; `cli_scenarios.older_layout`) still resumes to the uninterrupted run's step-6
    arrays, bit for bit: its rng_state.npz is verified and restored. (Without that restore the
    dropout masks differ: checked by skipping it.) New checkpoints have no rng_state.npz."""
    older = scenarios["older_layout"]
    assert older["label"] == "removed step-2"
    assert older["moved"] and len(older["moved"]) == len(older["rng"])
    assert older["status"] == 0, older["stderr"]
    assert "Resuming from step 4" in older["stdout"]
    assert older["differences"] == []
    for b in scenarios["boundaries"]:
        assert "rng_state.npz" not in b["sha256"]


@pytest.mark.parametrize("name,damage", [
    ("model.weights.h5", "corrupt"), ("model.weights.h5", "missing"),
    ("training_state.json", "corrupt"), ("manifest.json", "corrupt"),
    ("manifest.json", "missing")])
def test_corrupt_or_missing_checkpoint_file_is_a_one_line_error(scenarios, tmp_path, capsys,
                                                                 name, damage):
    output = _copy(scenarios, tmp_path)
    path = output / "checkpoints" / "step-6" / name
    if damage == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = os.urandom(64)
        path.write_bytes(bytes(data))
    status, err = _pretrain(capsys, scenarios["args"], output, "--steps", "8")
    assert status == 1
    assert len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "to start fresh" in err, err


def test_output_directory_is_locked_while_a_run_holds_it(scenarios, tmp_path, capsys):
    output = _copy(scenarios, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from keras_bertfam.run_directory import RunDirectory\n"
         f"run = RunDirectory({str(output)!r}); run.open(); print('held', flush=True)\n"
         "sys.stdin.read()"],
        env=dict(_env(), KERAS_BERTFAM_LAZY_IMPORT="1"), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status, err = _pretrain(capsys, scenarios["args"], output)
        assert status == 1 and f"PID {holder.pid}" in err and "in use by another run" in err
    finally:
        holder.communicate("")
    # the holder exited: its lock is gone, a rerun proceeds (here: nothing to do)
    assert _pretrain(capsys, scenarios["args"], output)[0] == 0


def test_stale_lock_of_a_dead_process_is_taken_over(scenarios, tmp_path, capsys):
    output = _copy(scenarios, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (output / ".lock").write_text(dead + "\n")  # as a kill -9 leaves it
    status = cli.main([*scenarios["args"], "--output", str(output)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"Took over the lock of {output} from PID {dead}" in captured.out
    assert not (output / ".lock").exists()


def test_unwritable_output_is_refused_before_training(tmp_path, capsys, monkeypatch):
    real_open = open

    def read_only(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(run_directory, "open", read_only, raising=False)
    monkeypatch.setattr(cli, "_pretrain", lambda *a: pytest.fail("training started"))
    args = pretrain_args("bert_tiny_en_uncased")  # refused before the preset is read
    status, err = _pretrain(capsys, args, tmp_path / "out")
    assert status == 1 and "is not a writable directory" in err and "Permission denied" in err
    (tmp_path / "file").write_text("x")
    status, err = _pretrain(capsys, args, tmp_path / "file" / "out")
    assert status == 1 and "is not a writable directory" in err


def test_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--steps must be positive"):
        cli.main(["pretrain", "--steps", "0", "--output", str(tmp_path / "never")])
    with pytest.raises(SystemExit, match="--group-by-length does not apply to --family xlnet"):
        cli.main(["pretrain", "--family", "xlnet", "--preset", "xlnet_base_cased",
                  "--group-by-length", "--output", str(tmp_path / "never")])
    status = cli.main(["pretrain", "--preset", "bert_tiny_en_uncasd", "--output",
                       str(tmp_path / "typo")])
    err = capsys.readouterr().err
    assert status == 1 and "Did you mean bert_tiny_en_uncased" in err, err
    assert len(err.strip().splitlines()) == 1
