"""Model zoo: every model is a :class:`StagedModel` with documented cuts."""

from jsfl.models import lenet5, mobilenet_v1, resnet18, small_cnn  # noqa: F401  (register)
from jsfl.models.base import StagedModel, count_params, get_model, model_names, register

__all__ = ["StagedModel", "count_params", "get_model", "model_names", "register"]
