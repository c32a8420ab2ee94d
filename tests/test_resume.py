"""Users' own resumes: Keras' BackupAndRestore and ModelCheckpoint with our tasks on raw text.

An interrupted run is interrupted deterministically (a callback raises at a chosen epoch or batch)
and resumed as a user's script is re-run: a new task built the same way, the same `fit`. The
resumed run must end with the uninterrupted run's weights, optimizer state and seed generators'
state, bit for bit, with dropout on. Each kind of run trains once uninterrupted (`reference`).
On TensorFlow, but for one MaskedLM resume on every backend (the seed generators' and the
optimizer's state saved and restored by JAX's and torch's variables, without dropout on torch;
the raw-text pipelines are tf.data on every backend).
"""
import contextlib
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_bertfam as kb
from tests.conftest import pipeline_builds

WORDS = ["good", "bad", "dull", "fine", "great", "odd", "nice", "poor"]
TEXTS = [f"the film number {i} was {w} and long" for i, w in enumerate(WORDS * 2)]
# Every word of the texts whole (the size of the vocabulary is not what these tests check: BERT's
# 30,522 rows made ~20% of each fit's CPU, in building, tracing and running the embeddings).
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]
         + sorted({word for text in TEXTS for word in text.split()}))
# Dropout on: Keras' backups do not hold its seed generators' state; ours do
# (Task.save_own_variables).
TINY = dict(vocabulary_size=len(VOCAB), num_layers=1, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=32, dropout=0.1)
LABELS = [i % 2 for i in range(len(TEXTS))]
EPOCHS = 3  # 4 batches of 4 an epoch (mlm, classifier); pipelines of unknown length vary
DOCUMENTS = [". ".join(TEXTS[i:i + 4]) + "." for i in range(0, 16, 2)]


class Interrupt(keras.callbacks.Callback):
    """Raises at the start of `epoch` (at its `batch` when given)."""

    def __init__(self, epoch, batch=None):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch
        if self.batch is None and epoch == self.epoch:
            raise RuntimeError("interrupted")

    def on_train_batch_begin(self, batch, logs=None):
        if self.batch is not None and self.current == self.epoch and batch == self.batch:
            raise RuntimeError("interrupted")


def make_task(kind, dropout=TINY["dropout"], frozen=None):
    """The task of `kind`, compiled; `frozen`: whose LayerNorm is frozen before compiling, the
    embeddings' ("embeddings") or the transformer block's attention's ("attention")."""
    keras.utils.set_random_seed(1)
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)
    if kind == "sop":
        backbone = kb.models.AlbertBackbone(**dict(TINY, embedding_dim=8, dropout=dropout))
    else:
        backbone = kb.models.BertBackbone(**dict(TINY, dropout=dropout))
    if kind == "classifier":
        preprocessor = kb.tasks.TextClassifier.default_preprocessor(tokenizer, backbone,
                                                                   sequence_length=16)
        task = kb.tasks.TextClassifier(backbone, num_classes=2, preprocessor=preprocessor,
                                       dropout=0.1)
    else:
        cls = {"mlm": kb.tasks.MaskedLM, "stream": kb.tasks.MaskedLM,
               "nsp": kb.tasks.BertPretrainer, "sop": kb.tasks.AlbertPretrainer}[kind]
        preprocessor = cls.default_preprocessor(tokenizer, backbone, sequence_length=16, seed=5,
                                                batch_size=4)
        task = cls(backbone, preprocessor=preprocessor)
    if frozen:
        owner = (backbone.embeddings if frozen == "embeddings"
                 else backbone.transformer_layers[0].attention)
        owner.layer_norm.trainable = False
    task.compile()
    return task


def data(kind):
    """-> (x, fit's keyword arguments): in-memory strings (shuffled every epoch) or a dataset.
    Of unknown length (a new number of batches every epoch): NSP pairs of a dataset of
    documents, SOP pairs of in-memory documents (shuffled every epoch), a stream of strings
    (reshuffled every pass)."""
    if kind == "mlm":
        return TEXTS, dict(batch_size=4)
    if kind == "classifier":
        return tf.data.Dataset.from_tensor_slices((TEXTS, LABELS)).batch(4), {}
    if kind == "stream":  # reshuffled at every pass, as read_corpus(shuffle_files=True)
        return tf.data.Dataset.from_tensor_slices(TEXTS).shuffle(
            16, seed=2, reshuffle_each_iteration=True).filter(lambda t: True), {}
    if kind == "sop":
        return DOCUMENTS, dict(batch_size=2)
    return tf.data.Dataset.from_tensor_slices(DOCUMENTS), {}


def state(task):
    return ([v.numpy() for v in task.weights] + [v.numpy() for v in task.optimizer.variables]
            + [g.state.numpy() for g in task._all_seed_generators()])


_REFERENCES = {}


def reference(kind):
    """The state after the uninterrupted run of `kind` (one per kind and test session), and
    how many times its pipeline was opened (`openings`; None for a fine-tuning task's)."""
    if kind not in _REFERENCES:
        task = make_task(kind)
        with openings(task) as opened:
            fit(task, kind, [])
        _REFERENCES[kind] = state(task), int(opened[0].numpy()) if opened else None
        keras.backend.clear_session(free_memory=False)
    return _REFERENCES[kind]


@contextlib.contextmanager
def openings(task):
    """Counts the openings of the pipelines of a pretraining task's `prepare_epochs` while in
    the block (as their first element is asked for): a list, [a counter variable] (empty for a
    task without `prepare_epochs`)."""
    prepare_epochs = getattr(task.preprocessor, "prepare_epochs", None)
    if prepare_epochs is None:
        yield []
        return
    opened = tf.Variable(0, dtype=tf.int64)

    def counted(*args, **kwargs):
        run = prepare_epochs(*args, **kwargs)
        return tf.data.Dataset.from_tensors(0).map(lambda _: opened.assign_add(1)).flat_map(
            lambda _: run)

    object.__setattr__(task.preprocessor, "prepare_epochs", counted)
    try:
        yield [opened]
    finally:
        del task.preprocessor.__dict__["prepare_epochs"]


def assert_same_state(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


def fit(task, kind, callbacks, epochs=EPOCHS, **kwargs):
    x, options = data(kind)
    return task.fit(x, epochs=epochs, verbose=0, callbacks=callbacks, **options, **kwargs)


# kind: (BackupAndRestore's save_freq, the batch of epoch 2 its run is interrupted at)
INTERRUPTIONS = {"mlm": (2, 1), "classifier": ("epoch", None), "nsp": (3, 2),
                 "sop": ("epoch", None), "stream": (2, 1)}
# The kinds and files test_model_checkpoint_reloaded_and_fit_on_is_the_uninterrupted_run
# reloads: a ModelCheckpoint each, every epoch, in the interrupted run of the kind.
CHECKPOINT_CASES = [("mlm", "task.keras"), ("mlm", "task.weights.h5"),
                    ("nsp", "task.weights.h5")]
_INTERRUPTED = {}


class _StepsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_epoch_end(self, epoch, logs=None):
        self.steps.append(int(self.model.optimizer.iterations.numpy()))


def interrupted(kind, tmp_path_factory):
    """The interrupted run of `kind` (one per kind and test session): a BackupAndRestore
    (`INTERRUPTIONS`) and a ModelCheckpoint every epoch for each file its checkpoint cases
    reload (the callbacks only read the model), interrupted at epoch 2 (at its batch 1 or 2
    where given: the last backup is mid-epoch). -> a dict: "backup" (its directory, for the one
    resume of test_backup_and_restore_resume_is_the_uninterrupted_run), "builds" (the run's
    pipeline builds), "preprocessor" (its config), "checkpoints" ({file: path}) and "steps"
    (the optimizer's step count when the last checkpoint was written, at epoch 1's end)."""
    if kind not in _INTERRUPTED:
        root = tmp_path_factory.mktemp(f"interrupted_{kind}")
        save_freq, batch = INTERRUPTIONS[kind]
        paths = {file: str(root / file) for k, file in CHECKPOINT_CASES if k == kind}
        task = make_task(kind)
        at_epoch_end = _StepsAtEpochEnd()
        callbacks = [keras.callbacks.BackupAndRestore(str(root / "backup"), save_freq=save_freq),
                     *[keras.callbacks.ModelCheckpoint(path,
                                                       save_weights_only=file.endswith(".h5"))
                       for file, path in paths.items()], at_epoch_end, Interrupt(2, batch)]
        with pipeline_builds(task) as builds, pytest.raises(RuntimeError, match="interrupted"):
            fit(task, kind, callbacks)
        _INTERRUPTED[kind] = dict(backup=str(root / "backup"), builds=len(builds),
                                  preprocessor=task.preprocessor.get_config(),
                                  checkpoints=paths, steps=at_epoch_end.steps[-1])
        keras.backend.clear_session(free_memory=False)
    return _INTERRUPTED[kind]


@pytest.mark.parametrize("kind", INTERRUPTIONS)
def test_backup_and_restore_resume_is_the_uninterrupted_run(kind, tmp_path_factory):
    """Interrupted at epoch 2 (at its batch 1 or 2 with a backup every 2 or 3 batches: the last
    backup is mid-epoch) and resumed: the same weights and optimizer state as without the
    interruption. Before, the resumed epochs read the pipeline from its start (epoch 0's masks,
    pairs and order again), and a mid-epoch backup's epoch was replayed from its first batch
    (those batches trained on twice, one step more in all). Pipelines of unknown length (NSP and
    SOP pairs, a stream) read epoch 0's pairs and masks again; with dropout, the resumed run
    drew other dropout masks.

    A fit builds its pipeline once, interrupted or resumed: before, a pretraining one was built
    (traced) for its length with `prepare`, then again epoch by epoch (`prepare_epochs`), even
    at position 0, and a fine-tuning one resumed past its first batch for its length, then
    again from the position. (The interrupted run, `interrupted`, also writes the checkpoints
    that test_model_checkpoint_reloaded_and_fit_on_is_the_uninterrupted_run reloads.)"""
    expected, _ = reference(kind)
    run = interrupted(kind, tmp_path_factory)
    save_freq, _ = INTERRUPTIONS[kind]
    resumed = make_task(kind)
    with pipeline_builds(resumed) as resumed_builds:
        history = fit(resumed, kind,
                      [keras.callbacks.BackupAndRestore(run["backup"], save_freq=save_freq)])
    assert (run["builds"], len(resumed_builds)) == (1, 1)
    assert len(history.history["loss"]) == 1
    assert_same_state(expected, state(resumed))
    # The schedule decays over epochs x batches an epoch where that is known before the data is
    # read (4 batches of 4 texts), else it stays constant after warmup.
    known = kind in ("mlm", "classifier")
    assert resumed.optimizer._learning_rate.total_steps == (EPOCHS * 4 if known else None)
    # Keras keeps the restored epoch on the model: a later fit of it trained nothing.
    before = int(resumed.optimizer.iterations.numpy())
    fit(resumed, kind, [], epochs=1)
    assert int(resumed.optimizer.iterations.numpy()) > before


@pytest.mark.multibackend
def test_backup_and_restore_resume_is_the_uninterrupted_run_on_every_backend(tmp_path):
    """JAX and torch: a MaskedLM, 2 epochs of 4 batches, backed up every 2 batches,
    interrupted at epoch 1's batch 3 (the last backup mid-epoch, at step 6) and resumed: the
    uninterrupted run's weights, optimizer state (its step count read by `_StopAtStep` after
    each batch) and seed generators' state, each fit building its pipeline once.
    (TensorFlow: the test above, its "mlm" case.)

    With dropout: on JAX its masks are drawn from the seed generators' state
    (`Task.save_own_variables`; without it the resumed run's weights differ); on torch, Keras'
    `Dropout` without a seed draws its masks from torch's global random state
    (`torch.nn.functional.dropout`), which Keras' torch loop also draws from when it opens a
    data iterator (`DataLoader`), and which `Task.train_step` seeds every step from the task's
    saved state (without that the resumed weights differ by up to 4e-5). Torch's global state
    is left as it was before each fit."""
    if keras.backend.backend() == "tensorflow":
        pytest.skip("TensorFlow: test_backup_and_restore_resume_is_the_uninterrupted_run")
    dropout = TINY["dropout"]
    task = make_task("mlm", dropout)
    with pipeline_builds(task) as uninterrupted_builds:
        fit(task, "mlm", [], epochs=2)
    expected = state(task)
    backup = os.path.join(tmp_path, "backup")
    task = make_task("mlm", dropout)
    with pipeline_builds(task) as builds, pytest.raises(RuntimeError, match="interrupted"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup, save_freq=2),
                          Interrupt(1, 3)], epochs=2)
    resumed = make_task("mlm", dropout)
    if keras.backend.backend() == "torch":
        import torch

        before = torch.get_rng_state()
    with pipeline_builds(resumed) as resumed_builds:
        history = fit(resumed, "mlm", [keras.callbacks.BackupAndRestore(backup, save_freq=2)],
                      epochs=2)
    assert (len(uninterrupted_builds), len(builds), len(resumed_builds)) == (1, 1, 1)
    assert len(history.history["loss"]) == 1
    assert int(resumed.optimizer.iterations.numpy()) == 8
    assert_same_state(expected, state(resumed))
    if keras.backend.backend() == "torch":
        assert torch.equal(torch.get_rng_state(), before)


def test_backup_of_another_run_length_is_refused(mlm_backup, tmp_path):
    """A backup of epoch 1 at 4 steps an epoch, resumed with batches of 2 (8 an epoch): its
    optimizer's 4 steps are not epoch 1's start."""
    backup = damaged_copy(mlm_backup, tmp_path, lambda d: None)
    resumed = make_task("mlm")
    with pytest.raises(ValueError, match=r"another run: steps_per_epoch: 4 != 8"):
        resumed.fit(TEXTS, batch_size=2, epochs=EPOCHS, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup)])
    # Without the run file (a backup of Keras' own): the restored step count does not fit.
    os.remove(os.path.join(backup, "keras_bertfam_run.json"))
    with pytest.raises(ValueError, match=r"is of epoch 1, but its optimizer has taken 4 steps: "
                                         r"expected 8 to 16 at 8 steps an epoch"):
        resumed.fit(TEXTS, batch_size=2, epochs=EPOCHS, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup)])


def test_backup_of_a_run_that_froze_other_layers_is_refused_naming_them(tmp_path):
    """The same task and configuration, another LayerNorm frozen (the same number of optimizer
    variables): Keras restored the backup's moments by position, the frozen one's onto the
    other, and trained on from them silently. Refused naming the variables, before any step."""
    backup = str(tmp_path / "backup")
    task = make_task("mlm", frozen="embeddings")
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup), Interrupt(1)])
    resumed = make_task("mlm", frozen="attention")
    with pytest.raises(ValueError, match=r"Could not restore the backup in '.*backup' .*optimizer "
                       r"state .*text_embedding/layer_norm/vars/0 would get "
                       r".*transformer_block/attention/layer_norm/vars/0's"):
        fit(resumed, "mlm", [keras.callbacks.BackupAndRestore(backup)])
    assert int(resumed.optimizer.iterations.numpy()) == 0


def test_read_only_backup_dir_is_refused_before_training(tmp_path):
    backup = os.path.join(tmp_path, "backup")
    os.makedirs(backup)
    os.chmod(backup, 0o500)
    if os.access(backup, os.W_OK):
        pytest.skip("running as a user who can write anywhere (root)")
    task = make_task("mlm")
    with pytest.raises(PermissionError, match="backup_dir .*backup' is not writable"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup)])
    assert int(task.optimizer.iterations.numpy()) == 0


def test_backup_dir_that_is_a_file_is_refused_before_training(tmp_path):
    backup = os.path.join(tmp_path, "backup")
    open(backup, "w").close()
    task = make_task("mlm")
    with pytest.raises(ValueError, match="backup_dir .*backup' is a file; expected a directory"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup)])
    assert int(task.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("kind,file", CHECKPOINT_CASES)
def test_model_checkpoint_reloaded_and_fit_on_is_the_uninterrupted_run(kind, file,
                                                                         tmp_path_factory):
    """ModelCheckpoint every epoch, interrupted at epoch 2, reloaded (`load_model`, or a new
    task's `load_weights`) and `fit(initial_epoch=2)`: the uninterrupted run's weights and
    optimizer state (AdamW's moments and step count, the schedule's position). Before,
    `load_model` returned the task uncompiled (Keras compiles no model with its own `compile`),
    and `load_weights` into a compiled task skipped the optimizer's state (a warning): both went
    on from a fresh optimizer; the pipeline read epoch 0's masks (or pairs) again."""
    expected, _ = reference(kind)
    run = interrupted(kind, tmp_path_factory)
    path = run["checkpoints"][file]
    if file.endswith(".keras"):
        keras.utils.set_random_seed(1)  # as the script did
        resumed = keras.saving.load_model(path)
        assert resumed.preprocessor.get_config() == run["preprocessor"]
        gamma = resumed.backbone.get_layer("embeddings").weights[3]
        assert gamma.path.endswith("layer_norm/gamma")
        assert not resumed.optimizer._use_weight_decay(gamma)
    else:
        resumed = make_task(kind)
        resumed.load_weights(path)
    assert int(resumed.optimizer.iterations.numpy()) == run["steps"]
    fit(resumed, kind, [], initial_epoch=2)
    assert_same_state(expected, state(resumed))


@pytest.fixture(scope="module")
def mlm_backup(tmp_path_factory):
    """A MaskedLM's BackupAndRestore directory, interrupted at epoch 1."""
    backup = str(tmp_path_factory.mktemp("mlm") / "backup")
    task = make_task("mlm")
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup), Interrupt(1)])
    keras.backend.clear_session(free_memory=False)
    return backup


def damaged_copy(backup, tmp_path, damage):
    copy = os.path.join(tmp_path, "backup")
    import shutil

    shutil.copytree(backup, copy)
    damage(copy)
    return copy


def truncate(directory):
    path = os.path.join(directory, "latest.weights.h5")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def garble_metadata(directory):
    with open(os.path.join(directory, "training_metadata.json"), "w") as f:
        f.write("{not json")


def drop_run_file(directory):
    os.remove(os.path.join(directory, "keras_bertfam_run.json"))


@pytest.mark.parametrize("damage,error,message", [
    (truncate, OSError, r"Could not restore the backup in '.*backup' .*truncated file"),
    (garble_metadata, ValueError, r"Could not restore the backup in '.*backup' .*JSONDecodeError"),
])
def test_damaged_backup_is_refused_naming_it(mlm_backup, damage, error, message, tmp_path):
    """h5py's "truncated file" and json's "Expecting property name" named no file."""
    backup = damaged_copy(mlm_backup, tmp_path, damage)
    task = make_task("mlm")
    with pytest.raises(error, match=message):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup)])
    assert int(task.optimizer.iterations.numpy()) <= 4  # the backup's, if it loaded: no step


def test_backup_of_another_run_is_refused_naming_the_difference(mlm_backup, tmp_path):
    """The same model with another masker seed: Keras restored its weights and trained on with
    other masks, silently. A task of another class or size: Keras' load error named no
    directory."""
    backup = damaged_copy(mlm_backup, tmp_path, lambda d: None)
    keras.utils.set_random_seed(1)
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)
    backbone = kb.models.BertBackbone(**TINY)
    preprocessor = kb.tasks.MaskedLM.default_preprocessor(tokenizer, backbone, sequence_length=16,
                                                          seed=6, batch_size=4)
    task = kb.tasks.MaskedLM(backbone, preprocessor=preprocessor)
    with pytest.raises(ValueError, match=r"backup in '.*backup' was written by another run: "
                                         r"config.preprocessor.config.*seed: 5 != 6"):
        fit(task, "mlm", [keras.callbacks.BackupAndRestore(backup)])
    classifier = make_task("classifier")
    with pytest.raises(ValueError, match=r"another run: task: MaskedLM != TextClassifier"):
        fit(classifier, "classifier", [keras.callbacks.BackupAndRestore(backup)])
    # A backup without our run file (Keras' own, or ours before): the weights file's check
    # (`check_weights_file`), the directory named.
    drop_run_file(backup)
    with pytest.raises(ValueError, match=r"Could not restore the backup in '.*backup'.*Cannot "
                                         r"load the weights file .*latest\.weights\.h5' into "
                                         r"TextClassifier"):
        fit(classifier, "classifier", [keras.callbacks.BackupAndRestore(backup)])
    assert int(classifier.optimizer.iterations.numpy()) == 0


def test_a_fit_of_unknown_epoch_lengths_opens_its_pipeline_once():
    """Keras opens an iterator every epoch on data of unknown length (SOP pairs: as many as
    each epoch draws), and each opening of the preprocessor's pipeline instantiated every
    function of its tokenizer, pairer and masker again: ~0.5 s of CPU an epoch for these 8
    documents. One pipeline a fit now, read an epoch at a time (`_epoch_reader`): opened
    (counted as its first element is asked for: `openings`) once in 3 epochs, not 3 times, in
    the uninterrupted runs (`reference`) of SOP and NSP pairs and of a stream. The counted runs
    train on the same batches as uncounted ones: they are the states the resumes of
    test_backup_and_restore_resume_is_the_uninterrupted_run (not counted) equal bit for bit."""
    for kind in ("sop", "nsp", "stream"):
        assert reference(kind)[1] == 1, kind  # before: EPOCHS


def test_an_epoch_keyed_pipeline_is_the_same_from_any_start():
    """`prepare_epochs`: epoch e's batches depend on (seed, e) alone, so a pipeline that starts
    at epoch e, batch b gives the uninterrupted run's batches from there (NSP pairs of a
    dataset; in-memory documents shuffled every epoch), and epochs differ. Under the global
    seed 0, where TF's shuffle failed on a tensor seed ("symbolic tf.Tensor as a Python
    bool")."""
    keras.utils.set_random_seed(0)
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)
    backbone = kb.models.BertBackbone(**TINY)
    preprocessor = kb.tasks.BertPretrainer.default_preprocessor(
        tokenizer, backbone, sequence_length=16, seed=5, batch_size=4)
    documents = tf.data.Dataset.from_tensor_slices(DOCUMENTS)
    for shuffle_batch_size in (None, 2):
        # One pipeline per mode, read from each start as `Task._epoch_keyed` reads it: the
        # (epoch, skip) a variable holds when an iterator opens.
        start = tf.Variable([0, 0], dtype=tf.int64)
        epochs = tf.data.Dataset.from_tensors(0).map(lambda _: tf.unstack(start.read_value()))
        ds = preprocessor.prepare_epochs(documents, epochs, shuffle_batch_size=shuffle_batch_size)

        def batches(epoch, skip):
            start.assign([epoch, skip])
            return [np.concatenate([x["token_ids"], x["mask_positions"]], axis=1)
                    for x, _ in ds.as_numpy_iterator()]

        first, second = batches(0, 0), batches(1, 0)
        assert len(second) > 2
        for a, b in zip(batches(1, 2), second[2:], strict=True):
            np.testing.assert_array_equal(a, b)
        assert not all(np.array_equal(a, b) for a, b in zip(first, second))
