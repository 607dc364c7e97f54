"""api (see the package docstring)."""
