"""The package version (a leaf module: the runtime records it in every artifact)."""

__version__ = "0.1.0"
