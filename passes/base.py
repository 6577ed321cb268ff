"""The base class of spyre passes: a dataclass whose fields are its command-line options."""

import dataclasses
import typing
from typing import ClassVar

from torch_mlir import ir

from spyre_mlir.errors import SpyreError


class PassError(SpyreError):
    """A pass cannot transform its input. `location` places the diagnostic (an op's location, usually)."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


class OptionError(SpyreError, ValueError):
    pass


@dataclasses.dataclass
class SpyrePass:
    """A module pass written in Python. Subclasses set NAME and SUMMARY and implement `run(module)`.

    Options are dataclass fields: `spyre-tile{tile-m=64}` sets the field `tile_m`. A pass reports a failure by
    raising PassError (with the offending op's location); the runner turns it into a located diagnostic.
    """

    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""

    def run(self, module: ir.Operation) -> None:
        raise NotImplementedError

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "SpyrePass":
        fields = {f.name.replace("_", "-"): f for f in cls.options()}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, text in options.items():
            field = fields.get(key)
            if field is None:
                known = ", ".join(sorted(fields)) or "none"
                raise OptionError(f"pass '{cls.NAME}' has no option '{key}' (options: {known})")
            kwargs[field.name] = _convert(cls.NAME, key, text, hints[field.name])
        return cls(**kwargs)

    def __call__(self, op: ir.Operation, pass_) -> None:
        """The entry point the PassManager calls."""
        try:
            self.run(op)
        except PassError as e:
            (e.location or op.location).emit_error(f"{self.NAME}: {e}")
            pass_.signal_pass_failure()


def _convert(pass_name: str, key: str, text: str, kind):
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "on", ""):
                return True
            if text.lower() in ("0", "false", "off"):
                return False
            raise ValueError(text)
        return kind(text)
    except ValueError:
        raise OptionError(f"pass '{pass_name}': option '{key}' expects {kind.__name__}, got '{text}'") from None
