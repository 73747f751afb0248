"""jsfl: split and sequential federated learning in JAX, built for throughput."""

__version__ = "0.1.0"
