"""Placeholder (see ``flwr_datasets/__init__.py``)."""


def plot_label_distributions(*args, **kwargs):
  raise NotImplementedError("flwr_datasets placeholder")
