"""graders (see the package docstring)."""
