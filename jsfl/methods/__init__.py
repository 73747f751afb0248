"""The methods: one module per method, its ``METHOD`` (a
:class:`jsfl.core.method.Method`) and its option set beside it.

Importing this package imports no method module (nor JAX):
:mod:`jsfl.methods.catalog` lists every method by name with its options as
data, for the config checks, the sweep planner and the docs.
"""
