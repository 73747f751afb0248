"""Placeholder for flwr_datasets (our own code): the authors' ``get_data.py``
imports it at module level, but their dominant-label path (``--partition_method
dl``, the one the recipe runs) never calls it, and it needs the network."""


class FederatedDataset:
  def __init__(self, *args, **kwargs):
    raise NotImplementedError("flwr_datasets placeholder: only the dominant-label "
                              "path (--partition_method dl) runs offline")
