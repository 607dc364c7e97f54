"""runtimes (see the package docstring)."""
