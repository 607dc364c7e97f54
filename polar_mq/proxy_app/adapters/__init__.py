"""proxy_app/adapters (see the package docstring)."""
