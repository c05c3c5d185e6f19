"""The package version: the one source that pyproject.toml (setuptools) and the code read."""

__version__ = "0.1.0"
