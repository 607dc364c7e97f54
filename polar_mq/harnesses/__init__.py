"""harnesses (see the package docstring)."""
