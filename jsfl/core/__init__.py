"""The vocabulary of a round, under the engines and the methods: the static
setup, the round plan and its batches, client mapping, portions, the method
value, optimiser and tree helpers (see docs/extending.md)."""
