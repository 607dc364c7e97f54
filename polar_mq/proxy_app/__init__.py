"""proxy_app (see the package docstring)."""
