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
                         "--null-score-diff-threshold", "0.5"]) == 2
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


def test_a_read_only_directory_is_refused_before_training(tmp_path):
    """The console script on a directory the kernel will not write: an existing --output and a
    new one inside it. Root writes through permission bits, so for root the directory is bound
    read-only onto itself in a private mount namespace (`unshare --mount`: what a read-only
    volume is); for another user its permission bits say so."""
    readonly = tmp_path / "readonly"
    (readonly / "existing").mkdir(parents=True)
    if os.geteuid() == 0:
        bind = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
        wrap = ["unshare", "--mount", "sh", "-c", bind, "sh", str(readonly)]
        reason = "Read-only file system"
    else:
        for d in (readonly / "existing", readonly):
            d.chmod(0o555)
        wrap, reason = [], "Permission denied"
    try:
        for output in (readonly / "existing", readonly / "new"):
            cmd = [sys.executable, "-m", "keras_bertfam_cli",
                   *pretrain_args("bert_tiny_en_uncased"), "--output", str(output)]
            run = subprocess.run(wrap + cmd, env=_env(), capture_output=True, text=True,
                                 timeout=900)
            if "unshare failed" in run.stderr or "mount: " in run.stderr:
                pytest.skip(f"no private mount namespace here to make a read-only directory for "
                            f"root: {run.stderr.strip()}")
            assert run.returncode == 1, run.stderr
            assert f"--output {output} is not a writable directory ({reason}" in run.stderr
            assert len(run.stderr.strip().splitlines()) == 1, run.stderr  # no traceback
            assert run.stdout == ""  # refused before anything was loaded or trained
    finally:  # writable again for pytest's clean-up
        for d in (readonly, readonly / "existing"):
            d.chmod(0o755)
    assert sorted(p.name for p in readonly.rglob("*")) == ["existing"]  # nothing written


def test_bad_arguments(tmp_path, capsys):
    status = cli.main(["pretrain", "--steps", "0", "--output", str(tmp_path / "never")])
    _one_line_error(capsys, status, 2, "keras-bertfam pretrain: error: --steps 0 is not positive")
    status = cli.main(["pretrain", "--family", "xlnet", "--preset", "xlnet_base_cased",
                       "--group-by-length", "--output", str(tmp_path / "never")])
    _one_line_error(capsys, status, 2, "--group-by-length does not apply to --family xlnet")
    assert not (tmp_path / "never").exists()
    status = cli.main(["pretrain", "--preset", "bert_tiny_en_uncasd", "--output",
                       str(tmp_path / "typo")])
    err = capsys.readouterr().err
    assert status == 1 and "Did you mean bert_tiny_en_uncased" in err, err
    assert len(err.strip().splitlines()) == 1


# === One-line errors for user errors, checked before a model is built (session 38 sweep) ===
@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory):
    """The scenarios' --preset kind (one layer, 16 wide, 16 positions, bert_tiny's vocabulary),
    made here for the checks that need no training run."""
    return make_preset(str(tmp_path_factory.mktemp("tiny") / "preset"))


def _fake_preset(path, family="bert", backbone=None, task=None):
    """A preset directory holding only its manifest: enough for the checks made before
    anything is loaded."""
    os.makedirs(path, exist_ok=True)
    manifest = {"format_version": 1, "family": family,
                "backbone": backbone if backbone is not None else
                {"num_layers": 1, "num_heads": 2, "max_sequence_length": 16}}
    if task:
        manifest["task"] = task
    with open(os.path.join(path, "keras_bertfam.json"), "w") as f:
        json.dump(manifest, f)
    return str(path)


def _one_line_error(capsys, status, expected_status, *parts):
    err = capsys.readouterr().err
    assert status == expected_status, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err
    return err


def test_pretrain_exports_with_its_own_sequence_length(scenarios, tmp_path, capsys,
                                                       monkeypatch):
    """pretrain's export packs --sequence-length (XLNet's backbone has no position table for
    export to default to: `pretrain --family xlnet` failed there with "Pass sequence_length=").
    A finished run whose export is missing exports once more: recorded here."""
    output = _copy(scenarios, tmp_path)
    products = json.loads((output / "products.json").read_text())
    products.pop("export")
    (output / "products.json").unlink()  # hard-linked to the scenarios' own
    (output / "products.json").write_text(json.dumps(products))
    calls = []

    def export_preset(preset_dir, export_dir, heads=False, **kwargs):
        calls.append(kwargs)
        os.makedirs(export_dir)
        return export_dir

    monkeypatch.setattr(cli, "_export_preset", export_preset)
    status, err = _pretrain(capsys, scenarios["args"], output)
    assert status == 0, err
    assert [c.get("sequence_length") for c in calls] == [16]


def test_export_sequence_length_of_a_preset_without_a_position_table(tmp_path, capsys,
                                                                      monkeypatch):
    """An XLNet preset (relative positions): its task's preprocessor length, or --sequence-length,
    or a one-line refusal before anything is loaded or written."""
    calls = []
    monkeypatch.setattr(cli, "_export_preset", lambda preset, out, **kw: calls.append(kw) or out)
    xlnet = {"num_layers": 1, "num_heads": 2}
    backbone = _fake_preset(tmp_path / "xlnet_backbone", "xlnet", xlnet)
    out = tmp_path / "export"
    status = cli.main(["export", "--task", backbone, "--output", str(out), "--no-audit"])
    _one_line_error(capsys, status, 2, f"--task {backbone} holds a xlnet backbone",
                    "pass --sequence-length N")
    assert not calls and not out.exists()
    assert cli.main(["export", "--task", backbone, "--output", str(out), "--no-audit",
                     "--sequence-length", "24"]) == 0
    pretrainer = _fake_preset(tmp_path / "xlnet_task", "xlnet", xlnet, task={
        "class_name": "XLNetPretrainer", "config": {},
        "preprocessor": {"sequence_length": 32}})
    assert cli.main(["export", "--task", pretrainer, "--output", str(out), "--no-audit"]) == 0
    assert [c["sequence_length"] for c in calls] == [24, 32]


def test_init_weights_keeps_the_presets_position_table(tiny_preset, tmp_path, capsys,
                                                       monkeypatch):
    """--init-weights loads the preset's weights: its position table keeps their rows (16 here;
    a shorter --sequence-length fits in it), and a longer --sequence-length is refused before
    the model is built."""
    import keras_bertfam as kb

    argv = [*pretrain_args(tiny_preset), "--output", str(tmp_path / "run"), "--init-weights",
            "--sequence-length", "8"]
    args = cli._parser().parse_args(argv)
    cli._check_args(args)
    tokenizer = kb.preprocessing.Tokenizer.from_preset(tiny_preset)
    task = cli._build_task(args, kb, tokenizer)
    assert task.backbone.max_sequence_length == 16
    assert task.preprocessor.sequence_length == 8
    monkeypatch.setattr(cli, "_build_task", lambda *a: pytest.fail("the model was built"))
    argv[argv.index("8")] = "32"
    status = cli.main(argv)
    _one_line_error(capsys, status, 2, "--sequence-length 32 is longer than the position table "
                    f"of --preset {tiny_preset}", "expected --sequence-length <= 16")


def _two_corpora(tmp_path):
    """a/corpus.txt, b/corpus.txt and a/preset/ (a directory) under tmp_path."""
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "corpus.txt").write_text(f"text of {where}\n")
    preset = tmp_path / "a" / "preset"
    preset.mkdir()
    return preset


def _checked(tmp_path, *extra):
    args = cli._parser().parse_args(["pretrain", "--output", str(tmp_path / "run"), *extra])
    cli._check_args(args)
    return args


def test_resume_refuses_the_same_relative_corpus_name_from_another_directory(tmp_path,
                                                                             monkeypatch):
    """--corpus is compared as a resolved path: `--corpus corpus.txt` from another working
    directory is another file (it resumed silently on it)."""
    preset = _two_corpora(tmp_path)
    monkeypatch.chdir(tmp_path / "a")
    state = {"step": 2, "args": cli._resume_args(
        _checked(tmp_path, "--corpus", "corpus.txt", "--preset", str(preset)))}
    monkeypatch.chdir(tmp_path / "b")  # corpus.txt is b's
    with pytest.raises(cli.CommandError, match=r"--corpus .*b/corpus\.txt.*a/corpus\.txt"):
        cli._check_resume(_checked(tmp_path, "--corpus", "corpus.txt", "--preset", str(preset)),
                          state, "state")


def test_resume_accepts_the_same_files_spelled_otherwise(tmp_path, monkeypatch):
    """The same corpus file relative or absolute, the same preset directory with a trailing slash
    or "./", resume (they were refused as changed arguments); so does a state file written
    before paths were resolved (the names as given, resolved from the current directory)."""
    preset = _two_corpora(tmp_path)
    monkeypatch.chdir(tmp_path / "a")
    state = {"step": 2, "args": cli._resume_args(
        _checked(tmp_path, "--corpus", "corpus.txt", "--preset", "preset"))}
    cli._check_resume(_checked(tmp_path, "--corpus", str(tmp_path / "a" / "corpus.txt"),
                               "--preset", "./preset/"), state, "state")
    monkeypatch.chdir(tmp_path / "b")
    cli._check_resume(_checked(tmp_path, "--corpus", "../a/corpus.txt", "--preset",
                               f"{preset}/"), state, "state")
    monkeypatch.chdir(tmp_path / "a")
    older = dict(state, args=dict(state["args"], corpus="corpus.txt", preset="preset"))
    cli._check_resume(_checked(tmp_path, "--corpus", str(tmp_path / "a" / "corpus.txt"),
                               "--preset", str(preset)), older, "state")


@pytest.mark.parametrize("flag,value,message", [
    ("--learning-rate", "-1", "--learning-rate -1.0 is not a positive finite number"),
    ("--learning-rate", "nan", "--learning-rate nan is not a positive finite number"),
    ("--learning-rate", "inf", "--learning-rate inf is not a positive finite number"),
    ("--learning-rate", "0", "--learning-rate 0.0 is not a positive finite number"),
    ("--warmup-steps", "-5", "--warmup-steps -5 is negative: expected 0 or more steps")])
def test_bad_pretrain_values_are_refused_before_anything(tmp_path, capsys, monkeypatch, flag,
                                                         value, message):
    monkeypatch.setattr(cli, "_pretrain", lambda *a: pytest.fail("training started"))
    out = tmp_path / "out"
    status = cli.main(["pretrain", "--output", str(out), f"{flag}={value}"])
    _one_line_error(capsys, status, 2, message)
    assert not out.exists()


@pytest.mark.parametrize("value,message", [
    ("0", "--sequence-length 0 is not positive"), ("-5", "--sequence-length -5 is not positive"),
    ("17", "--sequence-length 17 is longer than the position table of --task"),
])
def test_bad_export_sequence_length_is_refused_before_anything(tmp_path, capsys, monkeypatch,
                                                               value, message):
    monkeypatch.setattr(cli, "_export_preset", lambda *a, **k: pytest.fail("export started"))
    preset = _fake_preset(tmp_path / "preset")  # 16 positions
    out = tmp_path / "export"
    status = cli.main(["export", "--task", preset, "--output", str(out),
                       f"--sequence-length={value}"])
    _one_line_error(capsys, status, 2, message)
    assert not out.exists()


@pytest.mark.parametrize("corpus,message", [
    ("missing.txt", "Corpus path not found"), ("empty.txt", "has no document"),
    ("emptydir", "contains no files"), ("bindir", "looks binary")])
def test_a_corpus_without_text_is_refused_before_the_model_is_built(tiny_preset, tmp_path,
                                                                    capsys, monkeypatch, corpus,
                                                                    message):
    (tmp_path / "empty.txt").write_text(" \n\n")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "bindir").mkdir()
    (tmp_path / "bindir" / "a.bin").write_bytes(b"\x00\x01\x9f" * 10)
    monkeypatch.setattr(cli, "_build_task", lambda *a: pytest.fail("the model was built"))
    path = str(tmp_path / corpus)
    status, err = _pretrain(capsys, pretrain_args(tiny_preset), tmp_path / "out", "--corpus",
                            path)
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert f"keras-bertfam pretrain: error: --corpus {path}: " in err and message in err, err


def test_library_user_errors_are_one_line_and_bugs_keep_their_traceback(tmp_path, capsys,
                                                                        monkeypatch):
    status = cli.main(["presets", "--family", "bertt"])
    _one_line_error(capsys, status, 2, "keras-bertfam presets: error: --family bertt: No presets "
                    "of family 'bertt'; families: ['albert', 'bert'")

    def fails(error):
        def command(args):
            raise error
        return command

    monkeypatch.setattr(cli, "presets_command", fails(PermissionError(13, "Permission denied",
                                                                      "/x")))
    _one_line_error(capsys, cli.main(["presets"]), 1, "Permission denied")
    monkeypatch.setattr(cli, "presets_command", fails(KeyError("a bug")))
    with pytest.raises(KeyError):
        cli.main(["presets"])
    monkeypatch.setattr(cli, "presets_command", fails(PermissionError(13, "denied", "/x")))
    with pytest.raises(PermissionError):  # --verbose: every traceback
        cli.main(["presets", "--verbose"])


def test_export_refuses_an_output_file_and_reports_a_damaged_preset(tiny_preset, tmp_path,
                                                                    capsys):
    (tmp_path / "afile").write_text("x")
    status = cli.main(["export", "--task", tiny_preset, "--output", str(tmp_path / "afile")])
    _one_line_error(capsys, status, 1, f"--output {tmp_path / 'afile'}", "is a file")
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_preset, damaged)
    weights = damaged / "backbone.weights.h5"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    weights.write_bytes(bytes(data))
    status = cli.main(["export", "--task", str(damaged), "--output", str(tmp_path / "e")])
    _one_line_error(capsys, status, 1, f"--task {damaged}:", "backbone.weights.h5' is corrupt")
    assert not (tmp_path / "e").exists()  # refused before a version directory is made


def test_analyze_checks_texts_and_head_before_computing(tiny_preset, tmp_path, capsys,
                                                        monkeypatch):
    import keras_bertfam.analysis.cli as analysis_cli

    monkeypatch.setattr(analysis_cli, "analyze", lambda args: pytest.fail("analyze started"))
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"ok\n\x9f\x00\xff")
    base = ["analyze", "--task", tiny_preset, "--output", str(tmp_path / "an")]
    status = cli.main([*base, "--texts", str(binary)])
    _one_line_error(capsys, status, 1, f"--texts {binary} is not")
    texts = os.path.join(HERE, "cli_corpus.txt")
    status = cli.main([*base, "--texts", texts, "--head", "9,9"])
    _one_line_error(capsys, status, 2, "--head 9,9: layer 9 is out of range", "has 1 layers")
    status = cli.main([*base, "--texts", texts, "--head", "0,2"])
    _one_line_error(capsys, status, 2, "--head 0,2: head 2 is out of range", "has 2 heads")
    assert not (tmp_path / "an").exists()


def test_analyze_is_quiet(tiny_preset, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keras_bertfam_cli", "analyze", "--task", tiny_preset, "--texts",
         os.path.join(HERE, "cli_corpus.txt"), "--output", str(tmp_path / "an"), "--max-texts",
         "2", "--plot-texts", "0", "--no-importance"],
        env=_env(), capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [m for m in TF_LOG_MARKERS if m in result.stderr], result.stderr[:2000]


def test_export_checks_tf_text_before_writing_and_audits_before_the_rename(
        tiny_preset, tmp_path, capsys, monkeypatch):
    """An unknown --tf-text is refused before anything is written; a SavedModel that fails the
    audit is never renamed into place (TF Serving would load that version)."""
    import keras_bertfam as kb

    out = tmp_path / "m"
    status = cli.main(["export", "--task", tiny_preset, "--output", str(out), "--tf-text", "9.9"])
    _one_line_error(capsys, status, 2, "--tf-text 9.9 is not a tf-text release the audit knows")
    assert not out.exists()

    def audit(path, tf_text):
        raise kb.export.UnsupportedOpsError(f"{path} uses 1 op(s) outside ...:\n  BadOp (in f)")

    monkeypatch.setattr(kb.export, "audit_ops", audit)
    status = cli.main(["export", "--task", tiny_preset, "--output", str(out)])
    _one_line_error(capsys, status, 1, "fails the op audit for tf-text 2.12.1",
                    f"{out / '1'} was not written", "BadOp")
    assert os.listdir(out) == []  # no version, no temporary


def test_concurrent_exports_take_the_next_version(tiny_preset, tmp_path, capsys, monkeypatch):
    """Two exports into one model directory both pick version 1: the one renaming second takes
    the next free version (an explicit version directory is refused instead), and leaves no
    temporary directory."""
    import keras_bertfam as kb

    out = tmp_path / "m"

    def export_saved_model(model, path, **kwargs):  # the other export finishes meanwhile
        os.makedirs(path)
        (tmp_path / "m" / "1").mkdir(exist_ok=True)
        (tmp_path / "m" / "1" / "saved_model.pb").write_text("the other export")
        (tmp_path / "m" / "2").mkdir(exist_ok=True)
        (tmp_path / "m" / "2" / "saved_model.pb").write_text("a third")
        open(os.path.join(path, "saved_model.pb"), "w").close()
        return ["serving_default"]

    monkeypatch.setattr(kb.export, "export_saved_model", export_saved_model)
    assert cli.main(["export", "--task", tiny_preset, "--output", str(out), "--no-audit"]) == 0
    assert f"SavedModel: {out / '3'} (encoder" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["1", "2", "3"]
    assert (out / "3" / "saved_model.pb").read_text() == ""
    shutil.rmtree(out)
    status = cli.main(["export", "--task", tiny_preset, "--output", str(out / "1"),
                       "--no-audit"])
    _one_line_error(capsys, status, 1, f"{out / '1'} was written by another export meanwhile")
    assert sorted(os.listdir(out)) == ["1", "2"]


# === #13: exit statuses: 2 the command line is wrong, 1 the run could not be done ===
@pytest.mark.parametrize("argv,status,message", [
    (["pretrain", "--steps", "abc"], 2, "argument --steps: invalid int value: 'abc'"),  # argparse
    (["pretrain", "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
    (["pretrain", "--batch-size", "-1"], 2, "--batch-size -1 is not positive"),
    (["analyze", "--texts", "TEXTS", "--head", "a,b"], 2, "--head a,b is not LAYER,HEAD"),
    (["analyze", "--texts", "TEXTS", "--max-texts", "0"], 2, "--max-texts 0 --plot-texts 2:"),
    (["export", "--heads"], 2, "holds no task (a backbone preset): --heads needs a task"),
    (["analyze", "--texts", "OUT/none.txt"], 1, "none.txt is not a file"),
    (["export", "--task", "OUT"], 1, "is not a preset directory (no keras_bertfam.json)"),
])
def test_exit_status_says_whether_the_command_line_is_wrong(tiny_preset, tmp_path, capsys,
                                                            monkeypatch, argv, status, message):
    """2 (argparse's own status): an argument's value or arguments that do not go together,
    argparse's errors with its usage, ours in one line; 1: a run the command line is right for
    could not be done. (Every other refusal's status is checked where it is tested.)"""
    monkeypatch.setattr(cli, "_pretrain", lambda *a: pytest.fail("training started"))
    monkeypatch.setattr(cli, "_import_tensorflow", lambda args: None)
    texts = os.path.join(HERE, "cli_corpus.txt")
    given = {"pretrain": ["--output", str(tmp_path / "run")],
             "analyze": ["--task", tiny_preset, "--output", str(tmp_path / "an")],
             "export": ["--task", tiny_preset, "--output", str(tmp_path / "e"), "--no-audit"]}
    argv = [argv[0], *given[argv[0]], *argv[1:]]
    argv = [a.replace("TEXTS", texts).replace("OUT", str(tmp_path)) for a in argv]
    if status == 2 and "argument" in message:  # argparse's: its usage line, then the error
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: keras-bertfam ") and message in err, err
    else:
        _one_line_error(capsys, cli.main(argv), status, f"keras-bertfam {argv[0]}: error: ",
                        message)
    assert sorted(os.listdir(tmp_path)) == []  # refused before anything was written


def test_an_interrupt_outside_trainings_own_stop_is_one_line_and_status_130(capsys,
                                                                            monkeypatch):
    """Ctrl-C while a model loads or exports (or a second Ctrl-C while training, which stops
    at once): `interrupted` in one line and 128 + SIGINT, the status of a run a SIGINT ends
    (training's own stop checkpoints first and exits with it too: the scenarios' SIGTERM);
    --verbose: the traceback."""
    def interrupted(args):
        raise KeyboardInterrupt

    def main(argv):
        try:
            return cli.main(argv)
        except KeyboardInterrupt:  # (not to pytest: it would end the session)
            pytest.fail("the KeyboardInterrupt went through with its traceback")

    monkeypatch.setattr(cli, "presets_command", interrupted)
    _one_line_error(capsys, main(["presets"]), 130, "keras-bertfam presets: interrupted")
    monkeypatch.setattr(cli, "pretrain", interrupted)
    _one_line_error(capsys, main(["pretrain", "--output", "x"]), 130,
                    "the same command resumes from the last checkpoint")
    with pytest.raises(KeyboardInterrupt):
        cli.main(["presets", "--verbose"])


def test_an_unknown_strategy_is_a_usage_error(tmp_path, capsys):
    """--strategy bogus: one line naming the known strategies, status 2 (it was a traceback)."""
    status = cli.main(["pretrain", "--strategy", "bogus", "--output", str(tmp_path / "run")])
    _one_line_error(capsys, status, 2, "keras-bertfam pretrain: error: --strategy bogus: Unknown "
                    "strategy 'bogus'; choose one of default, mirrored")


def test_a_strategy_the_environment_cannot_run_is_a_run_error(tmp_path, capsys, monkeypatch):
    """--strategy jax_data_parallel with only some of Keras' multi-process variables set exited
    2 (a usage error: "Multi-process JAX needs num_processes and process_id with
    job_addresses.") though the command line is right, or went on as one process without a
    word when the coordinator's address was the one missing (get_strategy returned a
    single-process DataParallel); on the TensorFlow backend it was a traceback. Now status 1,
    one line naming the variables set and the ones missing (and the backend it needs)."""
    names = [f"KERAS_DISTRIBUTION_{n}" for n in ("JOB_ADDRESSES", "NUM_PROCESSES", "PROCESS_ID")]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    argv = ["pretrain", "--strategy", "jax_data_parallel", "--output", str(tmp_path / "run")]
    prefix = "keras-bertfam pretrain: error: --strategy jax_data_parallel: "
    monkeypatch.setenv(names[2], "0")
    _one_line_error(capsys, cli.main(argv), 1, prefix, f"{names[2]}=0 is set but not "
                    f"{names[0]}, {names[1]}")
    monkeypatch.setenv(names[0], "localhost:1234")
    monkeypatch.delenv(names[2])
    _one_line_error(capsys, cli.main(argv), 1, prefix, f"{names[0]}=localhost:1234 is set but "
                    f"not {names[1]}, {names[2]}")
    monkeypatch.delenv(names[0])
    _one_line_error(capsys, cli.main(argv), 1, prefix, "needs KERAS_BACKEND=jax")


# === The same kills and resumes on JAX and PyTorch ===
@pytest.mark.multibackend
@pytest.mark.skipif(os.environ["KERAS_BACKEND"] == "tensorflow",
                    reason="the scenarios above run the CLI on TensorFlow")
def test_kill_and_resume_are_bit_identical_on_this_backend(tmp_path):
    """`keras-bertfam pretrain --deterministic` under KERAS_BACKEND (JAX, PyTorch; users pretrain
    there too), in one process (tests/cli_backend_scenarios.py): the directory a kill -9 leaves
    at every file boundary of every checkpoint write resumes from a complete checkpoint, and
    resumed (from step-4; from step-2 with a SIGTERM at step 3 in between) it ends with the
    uninterrupted run's weights, optimizer state (iterations, moments), seed generators' state
    and loss history, bit for bit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.run([sys.executable, os.path.join(HERE, "cli_backend_scenarios.py"),
                             str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=3600)
    assert driver.returncode == 0, driver.stderr[-5000:]
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    reference = results["reference"]
    assert reference["status"] == 0, reference["stderr"][-3000:]
    history = reference["state"]["history"]
    assert [h["step"] for h in history] == [2, 4, 6]

    boundaries = results["boundaries"]
    per_write = ["wrote model.weights.h5", "wrote training_state.json", "wrote manifest.json"]
    removal = ["renamed step-{} for removal", "removed step-{}"]
    assert [(b["writing"], b["label"]) for b in boundaries] == [
        (2, label) for label in per_write + ["renamed to step-2"]] + [
        (step, label.format(step - 2)) for step in (4, 6)
        for label in per_write + [f"renamed to step-{step}"] + removal]
    # before the rename, the previous checkpoint (none: a fresh start); from it, the new one
    assert [b["resumes_from"] for b in boundaries] == [None] * 3 + [2] * 4 + [4] * 6 + [6] * 3
    for b in boundaries:
        assert b["temporaries"] == [], b  # a resume starts by removing what the kill left
    for step in (2, 4, 6):  # a checkpoint's bytes, whichever boundary the kill came at
        sums = {json.dumps(b["sha256"], sort_keys=True) for b in boundaries
                if b["resumes_from"] == step}
        assert len(sums) == 1, step

    resumed = results["killed_resume_4"]
    assert resumed["status"] == 0, resumed["stderr"][-3000:]
    assert "Resuming from step 4" in resumed["stdout"]
    assert resumed["differences"] == []  # weights, optimizer, seed generators
    assert resumed["state"]["history"] == history  # the losses, bit for bit
    assert [(s["from_step"], s["to_step"]) for s in resumed["state"]["sessions"]] == [(0, 4),
                                                                                      (4, 6)]
    backend = os.environ["KERAS_BACKEND"]
    assert [s["backend"] for s in resumed["state"]["sessions"]] == [backend, backend]
    assert "trained under" not in resumed["stdout"]
    stopped = results["sigterm"]
    assert stopped["status"] == 128 + 15, stopped["stderr"][-3000:]
    assert "Resuming from step 2" in stopped["stdout"]
    assert "Stopped by SIGTERM at step 3" in stopped["stdout"]
    assert stopped["state"]["step"] == 3 and ".lock" not in stopped["entries"]
    resumed = results["sigterm_resume"]
    assert resumed["status"] == 0, resumed["stderr"][-3000:]
    assert "Resuming from step 3" in resumed["stdout"]
    assert resumed["differences"] == []
    # an entry per checkpoint, each the mean since the one before: step 4's is step 4's alone
    by_step = {h["step"]: h for h in resumed["state"]["history"]}
    assert sorted(by_step) == [2, 3, 4, 6]
    assert [by_step[2], by_step[6]] == [history[0], history[2]]

    # A checkpoint TensorFlow wrote resumes here (weights, optimizer and seed generators' state
    # load by value), saying that the random draws and kernels from its step on are this
    # backend's: the run is not the one TensorFlow would have continued, bit for bit.
    resumed = results["other_backend_resume"]
    assert resumed["status"] == 0, resumed["stderr"][-3000:]
    assert (f"Step 4 was trained under KERAS_BACKEND=tensorflow; this run continues under "
            f"{backend}") in resumed["stdout"], resumed["stdout"]
    assert resumed["differences"] == []  # (its state was this backend's)
    assert [s["backend"] for s in resumed["state"]["sessions"]] == ["tensorflow", backend]
