"""Placeholder (see ``flwr_datasets/__init__.py``)."""


class _Unavailable:
  def __init__(self, *args, **kwargs):
    raise NotImplementedError("flwr_datasets placeholder")


class DirichletPartitioner(_Unavailable):
  pass


class IidPartitioner(_Unavailable):
  pass


class ShardPartitioner(_Unavailable):
  pass


class DistributionPartitioner(_Unavailable):
  pass
