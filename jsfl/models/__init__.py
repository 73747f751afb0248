"""Model zoo: every model is a :class:`StagedModel` with documented cuts."""

from jsfl.models import (  # noqa: F401  (register)
  alexnet,
  densenet161,
  lenet5,
  mobilenet_v1,
  mobilenet_v2,
  resnet18,
  resnet101,
  small_cnn,
  vgg16,
)
from jsfl.models.base import StagedModel, count_params, get_model, model_names, register

__all__ = ["StagedModel", "count_params", "get_model", "model_names", "register"]
