"""The frontend's one user-facing error type.

Kept in its own torch-free module so the CLI can catch it without paying for a torch import.
"""


class FrontendError(Exception):
    """A model could not be loaded or imported, for a reason the user can act on.

    The message is a single paragraph meant to be printed as is (the CLI prints it and exits 2,
    without a traceback): it names the file or the op involved and says what to do.
    """
