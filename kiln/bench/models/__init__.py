"""The architectures of the built-in zoo (see `kiln.bench.zoo` for the registry and sizes)."""
