"""User-facing errors.

Raise :class:`XDistillError` (or a subclass) for bad input: a missing file, an unknown config key,
a projection built for another tokenizer pair. The message names the file/key/row/token that is
wrong and what was expected. The CLI prints it as one line (``xdistill: error: ...``) and exits 2.
"""


class XDistillError(Exception):
    """Bad user input or environment; printed as a one-line error by the CLI."""


class ConfigError(XDistillError):
    """An unknown key, a bad value type or an inconsistent setting in a config."""


class TokenizerError(XDistillError):
    """A tokenizer that cannot be found, loaded or used."""


class AlignmentError(XDistillError):
    """Inputs to the aligner that are inconsistent (ids out of range, bad lengths, ...)."""


class ProjectionError(XDistillError):
    """A projection artifact that is missing, corrupt or built for other tokenizers."""


class DataError(XDistillError):
    """A corrupt shard, a missing column, undecodable text, ..."""


class TeacherError(XDistillError):
    """A teacher worker that failed, died or timed out (carries the worker's traceback)."""
