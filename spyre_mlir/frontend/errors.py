"""The frontend's one user-facing error type.

Kept in its own torch-free module so the CLI can catch it without paying for a torch import.
"""

from spyre_mlir.errors import SpyreError, UnsupportedModelError


class FrontendError(SpyreError):
    """A model could not be loaded or imported, for a reason the user can act on.

    The message is a single paragraph meant to be printed as is (the CLI prints it and exits 2,
    without a traceback): it names the file or the op involved and says what to do.
    """


class ExportError(FrontendError, UnsupportedModelError):
    """torch.export could not trace the model (data-dependent control flow, ``.item()``, unsupported Python)."""


class StageError(FrontendError, UnsupportedModelError):
    """A compiler stage failed on a model that loaded fine (the compiler's failure, not the input's).

    Carries what a reproducer needs: ``input_ir``, the IR the failing pass pipeline ran on, and
    ``pipeline``, that textual pipeline (both None when the failure is in Python, e.g. the FX importer).
    """

    def __init__(self, message: str, input_ir: str | None = None, pipeline: str | None = None):
        super().__init__(message)
        self.input_ir = input_ir
        self.pipeline = pipeline


def mlir_error_detail(text: str) -> str:
    """An MLIRError's text without its "Failure while executing pass pipeline:" preamble, so that the first line
    says what failed and where."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith("Failure while executing")]
    return "\n".join(useful or lines)
