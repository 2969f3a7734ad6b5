"""Errors whose message tells the user what to change. All are ValueErrors."""

from .config import NeuronConfigError


class ExportError(ValueError):
    """The model cannot be exported as asked."""


class ArtifactError(ValueError):
    """An exported directory is missing a file or holds a corrupt one."""


class InputError(ValueError):
    """A runtime call got inputs that do not fit the compiled shapes."""


__all__ = ["ArtifactError", "ExportError", "InputError", "NeuronConfigError"]
