"""Specific error types of the evaluation engine, with messages a user can act on."""


class EvaluationError(Exception):
    """Base class for evaluation-engine errors."""


class DatasetError(EvaluationError):
    """A dataset or case could not be loaded (missing file, bad field, unsafe path)."""


class PromptError(EvaluationError):
    """A prompt template is missing or could not be rendered."""


class ModelConfigError(EvaluationError):
    """A model name, models file or endpoint setting is unusable."""


class PHIError(EvaluationError):
    """Content could not be made safe to leave for a remote endpoint."""


class StoreError(EvaluationError):
    """The run store is missing, locked, of another version, or inconsistent with the request."""
