"""tasks (see the package docstring)."""
