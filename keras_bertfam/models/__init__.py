"""One backbone per family; all but XLNet are configurations of `EncoderBackbone`."""
from keras_bertfam.models.albert import AlbertBackbone
from keras_bertfam.models.backbone import Backbone, EncoderBackbone
from keras_bertfam.models.bert import BertBackbone
from keras_bertfam.models.distil_bert import DistilBertBackbone
from keras_bertfam.models.electra import ElectraBackbone
from keras_bertfam.models.longformer import LongformerBackbone
from keras_bertfam.models.roberta import RobertaBackbone
from keras_bertfam.models.spanbert import SpanBertBackbone
from keras_bertfam.models.xlnet import XLNetBackbone
