"""One backbone per family; all but XLNet are configurations of `EncoderBackbone`."""
from keras_bertfam.models.backbone import Backbone, EncoderBackbone
from keras_bertfam.models.bert import BertBackbone
from keras_bertfam.models.roberta import RobertaBackbone
from keras_bertfam.models.albert import AlbertBackbone
