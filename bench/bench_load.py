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

Usage: python bench/bench_load.py [--rounds 3] [--dir /tmp/bench_load]
Not a test: numbers depend on the machine and its load.

Measured idle (TensorFlow backend, 2 CPU cores, nothing else running, 3 rounds, 2026-11-23):
    ours checked 4.25 s / unchecked 4.57 s = 0.93x; hf checked 4.54 s / unchecked 4.13 s = 1.10x;
    sha256 of the 438 MB weights alone 0.35 s (hashed in a thread while the backbone is built).
See BUILD.md ("Loading: integrity checks").
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import keras_bertfam as kb  # noqa: E402
from keras_bertfam.presets import checkpoints, get, integrity  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/bench_load")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    checked, unchecked, hf = (os.path.join(args.dir, n) for n in ("checked", "unchecked", "hf"))
    backbone = kb.models.BertBackbone(**get("bert_base_en_uncased").config)
    print(f"BertBackbone: {backbone.count_params() / 1e6:.1f}M parameters")
    kb.presets.save_backbone(backbone, checked)
    kb.presets.export_to_transformers(backbone, hf)
    del backbone
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
    load(names[0])  # warm up (imports, first graph)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            start = time.perf_counter()
            load(name)
            times[name].append(time.perf_counter() - start)
    median = {n: statistics.median(t) for n, t in times.items()}
    for name in names:
        print(f"{name:<16} median {median[name]:7.2f} s  ({', '.join(f'{t:.2f}' for t in times[name])})")
    for source in ("ours", "hf"):
        ratio = median[f"{source}, checked"] / median[f"{source}, unchecked"]
        print(f"{source}: checked / unchecked = {ratio:.3f}x")
    start = time.perf_counter()
    integrity.sha256(os.path.join(checked, kb.presets.BACKBONE_WEIGHTS))
    print(f"sha256 of the weights alone: {time.perf_counter() - start:.2f} s")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
