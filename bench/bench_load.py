"""Cost of the weight integrity checks when loading a 110M-parameter preset (BERT-Base config).

Two sources, each loaded with and without its check, interleaved in rounds in the same run so
that machine load hits both alike:
- our preset directory (`save_to_preset`): "checked" verifies the sha256 of backbone.weights.h5
  (in a thread, while the backbone is built); "unchecked" is the same directory with the
  manifest's `files` entry removed (what a preset saved before checksums existed loads as);
- an HF-format directory (`export_to_transformers`, model.safetensors): "checked" rejects
  non-finite tensors (`integrity.check_finite` on each); "unchecked" replaces that check with a
  no-op.
Prints the median load time of each and the ratio checked / unchecked (target: <= 1.10).

With `--ab OLD NEW` (two source trees, e.g. `git archive` checkouts of two commits) it compares
the trees' loading code instead: each load runs in a fresh process (`--child`, imports not
timed), the trees alternate (A B B A ...) so that machine load hits both alike: the README's
`TextClassifier.from_preset("all_minilm_l6_v2")`, and `BertBackbone.from_preset` of the
BERT-Base preset directory and of the HF directory. Prints each one's median wall and CPU
seconds (all threads) of the load, and the process's peak RSS, per tree.

With `--digests` it measures the tensor digests of a plain `save_weights` file instead: a
BERT-Base backbone's `load_weights` of its own `.weights.h5`, and its `check_weights_file`
alone, with the digests verified ("checked") and with them skipped ("unchecked": inside
`weights_files.checked_by_caller(path, verified_bytes=True)`, as a preset's load is),
interleaved in rounds; prints the medians (wall and CPU) and the ratios.

With `--archive` it measures the checks of a `.keras` archive (`Task.save`; Keras stores its
members uncompressed): a BERT TextClassifier's `load_weights` of its own archive, for a small one
(4 layers, 256 wide, ~45 MB) and a BERT-Base-sized one (~440 MB), with our checks
("checked": `check_weights_file`, whose `read_layout` opens the weights and `verify_archive`
checks their CRC-32, then Keras' load with `check_archive_store`) and without them ("unchecked":
Keras' `load_weights` alone, `check_archive_store` a no-op), and `check_weights_file` and
`read_layout` alone; interleaved in rounds, medians (wall and CPU), the load average printed per
round; then the peak of Python's allocations (tracemalloc) during `check_weights_file`. One more
row, "keras over a window", is not what the library does: Keras' own read (`_load_state`, a
private function) given a store whose h5 file reads the archive's weights through the check's
window (`weights_files.archive_member`) instead of zipfile's file object: what Keras' part of
the load would cost without zipfile's rewinds.
`--sizes small` limits it to the small archive.

Usage: python bench/bench_load.py [--rounds 3] [--dir /tmp/bench_load] [--ab OLD NEW]
                                  [--digests] [--archive [--sizes small,base]]
Not a test: numbers depend on the machine and its load.

Measured idle (TensorFlow backend, 2 CPU cores, nothing else running, 3 rounds, 2026-11-23):
    ours checked 4.25 s / unchecked 4.57 s = 0.93x; hf checked 4.54 s / unchecked 4.13 s = 1.10x;
    sha256 of the 438 MB weights alone 0.35 s (hashed in a thread while the backbone is built).
`--ab` (2026-11-26, load ~1-3, 5 rounds; old 198ad1a, new: deferred initialization): MiniLM
classifier 0.78 -> 0.40 s, BERT-Base preset dir 2.80 -> 1.66 s, HF dir 2.75 -> 1.42 s.
`--archive` (2026-11-28, load ~3.5-4, 7 rounds): 45 MB check_weights_file 3.25 -> 0.16 s,
load_weights checked / unchecked 2.07x -> 1.055x; 438 MB check 72.8 -> 0.55 s.
See BUILD.md ("Loading: integrity checks", "Loading: no initial values drawn").
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
AB_LOADS = ("minilm classifier", "ours base", "hf base")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/bench_load")
    parser.add_argument("--ab", nargs=2, metavar=("OLD", "NEW"),
                        help="compare two source trees' loading, in fresh processes")
    parser.add_argument("--digests", action="store_true",
                        help="the cost of a .weights.h5 file's tensor digests on load_weights")
    parser.add_argument("--archive", action="store_true",
                        help="the cost of a .keras archive's checks on load_weights")
    parser.add_argument("--sizes", default="small,base", help="with --archive: small, base")
    parser.add_argument("--child", choices=AB_LOADS, help=argparse.SUPPRESS)
    parser.add_argument("--src", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.src))
    if args.child:
        return child(args.child, args.dir)
    import keras_bertfam as kb
    from keras_bertfam.presets import get

    shutil.rmtree(args.dir, ignore_errors=True)
    if args.archive:
        compare_archive(args.sizes.split(","), args.rounds, args.dir)
        shutil.rmtree(args.dir, ignore_errors=True)
        return
    checked, unchecked, hf = (os.path.join(args.dir, n) for n in ("checked", "unchecked", "hf"))
    backbone = kb.models.BertBackbone(**get("bert_base_en_uncased").config)
    print(f"BertBackbone: {backbone.count_params() / 1e6:.1f}M parameters")
    if args.digests:
        compare_digests(backbone, args.rounds, args.dir)
        shutil.rmtree(args.dir, ignore_errors=True)
        return
    kb.presets.save_backbone(backbone, checked)
    kb.presets.export_to_transformers(backbone, hf)
    del backbone
    if args.ab:
        compare_trees(args.ab, args.rounds, args.dir)
    else:
        compare_checks(args.rounds, args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)


def interleaved(load, names, rounds, say_load=False):
    """Times `load(name)` for each of `names`, once to warm up (the page cache, Keras' first
    walk), then `rounds` rounds, the order reversed every other round. -> ({name: median wall s},
    {name: median CPU s of all threads}); prints each name's medians."""
    for name in names:
        load(name)
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(rounds):
        if say_load:
            print(f"round {r + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for name in (names if r % 2 == 0 else names[::-1]):
            start, start_cpu = time.perf_counter(), time.process_time()
            load(name)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    median = {n: statistics.median(t) for n, t in times.items()}
    median_cpu = {n: statistics.median(t) for n, t in cpu.items()}
    width = max(map(len, names)) + 2
    for name in names:
        print(f"{name:<{width}} median {median[name]:7.3f} s, CPU {median_cpu[name]:7.3f} s  "
              f"({', '.join(f'{t:.2f}' for t in times[name])})")
    return median, median_cpu


def compare_checks(rounds, root):
    """The integrity checks' cost: each source loaded with and without its check, in turn."""
    import keras

    import keras_bertfam as kb
    from keras_bertfam.presets import checkpoints, integrity

    checked, unchecked, hf = (os.path.join(root, n) for n in ("checked", "unchecked", "hf"))
    shutil.copytree(checked, unchecked)
    manifest_path = os.path.join(unchecked, kb.presets.MANIFEST)
    manifest = json.load(open(manifest_path))
    manifest.pop("files")
    json.dump(manifest, open(manifest_path, "w"))
    size = os.path.getsize(os.path.join(checked, kb.presets.BACKBONE_WEIGHTS))
    print(f"backbone.weights.h5: {size / 1e6:.0f} MB")

    real_check = integrity.check_finite

    def load(name):
        if name == "ours, checked":
            kb.models.BertBackbone.from_preset(checked)
        elif name == "ours, unchecked":
            kb.models.BertBackbone.from_preset(unchecked)
        else:
            checkpoints.integrity.check_finite = (real_check if name == "hf, checked"
                                                  else lambda *a: None)
            try:
                kb.presets.convert(hf)
            finally:
                checkpoints.integrity.check_finite = real_check
        keras.backend.clear_session()

    names = ["ours, checked", "ours, unchecked", "hf, checked", "hf, unchecked"]
    median, _ = interleaved(load, names, rounds)
    for source in ("ours", "hf"):
        ratio = median[f"{source}, checked"] / median[f"{source}, unchecked"]
        print(f"{source}: checked / unchecked = {ratio:.3f}x")
    start = time.perf_counter()
    integrity.sha256(os.path.join(checked, kb.presets.BACKBONE_WEIGHTS))
    print(f"sha256 of the weights alone: {time.perf_counter() - start:.2f} s")


def compare_digests(backbone, rounds, root):
    """`backbone.load_weights` of its own file, its tensors' digests verified or skipped."""
    from keras_bertfam.models import weights_files

    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "base.weights.h5")
    start = time.perf_counter()
    backbone.save_weights(path)
    print(f"save_weights (with the record): {time.perf_counter() - start:.2f} s, "
          f"{os.path.getsize(path) / 1e6:.0f} MB")
    start = time.perf_counter()
    weights_files.record(path, backbone)
    print(f"the record alone (settings, digests): {time.perf_counter() - start:.2f} s")

    def load(name):
        run = backbone.load_weights if name.startswith("load_weights") else (
            lambda p: weights_files.check_weights_file(backbone, p))
        if name.endswith(", checked"):
            run(path)
        else:
            with weights_files.checked_by_caller(path, verified_bytes=True):
                run(path)

    # the whole load, and its check alone (shorter: less noise from other processes)
    names = ["load_weights, checked", "load_weights, unchecked", "check_weights_file, checked",
             "check_weights_file, unchecked"]
    median, median_cpu = interleaved(load, names, rounds)
    for what in ("load_weights", "check_weights_file"):
        on, off = f"{what}, checked", f"{what}, unchecked"
        print(f"{what}: checked / unchecked = {median[on] / median[off]:.3f}x wall, "
              f"{median_cpu[on] / median_cpu[off]:.3f}x CPU; the digests add "
              f"{median[on] - median[off]:+.3f} s wall")
    saved = weights_files.read_layout(path)
    start = time.perf_counter()
    weights_files.verify_digests(path, saved.record["digests"], saved.places)
    print(f"the digests alone (`tensor_digest` of every tensor): "
          f"{time.perf_counter() - start:.2f} s")


def compare_archive(sizes, rounds, root):
    """A TextClassifier's `load_weights` of its own `.keras` archive, with and without our checks
    (`check_weights_file`, `check_archive_store`), and the check alone, interleaved."""
    import tracemalloc
    import zipfile

    import h5py
    import keras
    from keras.src.saving import saving_lib

    import keras_bertfam as kb
    from keras_bertfam.models import backbone as backbone_module
    from keras_bertfam.models import weights_files
    from keras_bertfam.presets import get
    from keras_bertfam.tasks import task as task_module

    base = get("bert_base_en_uncased").config
    configs = {"small": dict(base, num_layers=4, num_heads=4, hidden_dim=256,
                             intermediate_dim=1024), "base": base}
    os.makedirs(root, exist_ok=True)
    real_store_check = weights_files.check_archive_store

    class WindowStore(saving_lib.H5IOStore):
        """Keras' read store over the verified window of the archive's weights."""

        def __init__(self, view):
            self._view = view
            super().__init__(weights_files.ARCHIVE_WEIGHTS, mode="r")

        def _get_h5_file(self, path_or_io, mode=None):
            return h5py.File(weights_files._Window(self._view), "r")

    def store_check(on):
        for module in (task_module, backbone_module):
            module.check_archive_store = real_store_check if on else (lambda store: None)

    for size in sizes:
        keras.backend.clear_session()
        task = kb.tasks.TextClassifier(kb.models.BertBackbone(**configs[size]), num_classes=2,
                                       preprocessor=None)
        path = os.path.join(root, f"{size}.keras")
        task.save(path)
        print(f"=== {size}: {task.count_params() / 1e6:.1f}M parameters, {path} "
              f"{os.path.getsize(path) / 1e6:.0f} MB", flush=True)

        def load(name):
            if name == "load_weights, checked":
                task.load_weights(path)
            elif name == "load_weights, unchecked":
                store_check(False)
                try:
                    keras.Model.load_weights(task, path)
                finally:
                    store_check(True)
            elif name == "keras over a window":
                with zipfile.ZipFile(path) as archive, weights_files.archive_member(
                        archive, path) as view:
                    store = WindowStore(view)
                    saving_lib._load_state(task, weights_store=store, assets_store=None,
                                           inner_path="", visited_saveables=set())
                    store.close()
            elif name == "check_weights_file":
                weights_files.check_weights_file(task, path, task._task_class_name())
            else:
                weights_files.read_layout(path)

        names = ["load_weights, checked", "load_weights, unchecked", "keras over a window",
                 "check_weights_file", "read_layout"]
        median, median_cpu = interleaved(load, names, rounds, say_load=True)
        on, off = median["load_weights, checked"], median["load_weights, unchecked"]
        print(f"load_weights: checked / unchecked = {on / off:.3f}x wall, "
              f"{median_cpu['load_weights, checked'] / median_cpu['load_weights, unchecked']:.3f}"
              f"x CPU; the checks add {on - off:+.3f} s wall")
        tracemalloc.start()
        weights_files.check_weights_file(task, path, task._task_class_name())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"check_weights_file: peak Python allocations {peak / 1e6:.1f} MB", flush=True)
        del task
        os.remove(path)


def child(kind, root):
    """One load in this fresh process; prints its wall and CPU seconds and the peak RSS."""
    import keras_bertfam as kb

    start, cpu = time.perf_counter(), time.process_time()
    if kind == "minilm classifier":
        kb.tasks.TextClassifier.from_preset("all_minilm_l6_v2", num_classes=2)
    else:
        kb.models.BertBackbone.from_preset(os.path.join(root, "checked" if kind == "ours base"
                                                        else "hf"))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    with open("/proc/self/status") as f:  # VmHWM: ru_maxrss would count the parent's at fork
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": peak / 1024, "module": kb.__file__}))


def compare_trees(trees, rounds, root):
    """`AB_LOADS` with each tree's code, each load in a fresh process, the trees alternating."""
    runs = {(tree, kind): [] for tree in trees for kind in AB_LOADS}
    for r in range(rounds):
        print(f"round {r + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for kind in AB_LOADS:
            for tree in (trees if r % 2 == 0 else trees[::-1]):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", kind, "--src", tree,
                     "--dir", root], cwd=tree, capture_output=True, text=True, check=True)
                run = json.loads(out.stdout.strip().splitlines()[-1])
                assert run["module"].startswith(os.path.abspath(tree)), run["module"]
                runs[tree, kind].append(run)
    print("=== summary: median of", rounds, "fresh processes each")
    for kind in AB_LOADS:
        for tree in trees:
            rs = runs[tree, kind]
            median = {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "rss_mb")}
            walls = ", ".join("%.2f" % r["wall"] for r in rs)
            print(f"{kind:<18} {tree:<24} wall {median['wall']:6.2f} s  cpu {median['cpu']:6.2f} s"
                  f"  peak RSS {median['rss_mb']:6.0f} MB  (wall {walls})")


if __name__ == "__main__":
    main()
