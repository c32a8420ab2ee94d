"""keras_bertfam: the BERT family for Keras 3, with every pretraining objective."""
from keras_bertfam import layers, models, preprocessing, presets, tasks
from keras_bertfam import distribute, export
from keras_bertfam import analysis
from keras_bertfam.version import __version__
