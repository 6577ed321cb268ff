"""The project's error types share one base, so callers (and tests) can tell a clear, expected error from a bug.

Every error a user can meet through ``spyre_mlir.compile``, an executable's call, the ``spyre`` torch.compile
backend or the tools derives from :class:`SpyreError`; its message names the op, the source location or the
file, and what is unsupported. Anything else escaping is a defect. Kept import-free (no torch, no MLIR) so
the runtime and the tools can use it cheaply.
"""


class SpyreError(Exception):
    """Base of every error spyre-mlir raises on purpose."""


class UnsupportedModelError(SpyreError):
    """The program cannot be brought to linalg-on-tensors: torch.export cannot trace it, or Torch-MLIR cannot
    lower one of its ops. Nothing later in spyre-mlir was tried."""


class InternalError(SpyreError):
    """An unexpected exception inside spyre-mlir (a defect), wrapped so callers meet one error family; the
    message names the stage and the original exception, which is chained as ``__cause__``."""
