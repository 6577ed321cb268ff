"""The registry of spyre passes: pass name -> (module, class), imported only when used.

One module per pass, named after it: `spyre-convert-linalg` lives in `passes/convert_linalg.py` and is tested by
`test/Conversion/LinalgToSpyre/*.mlir` (conversions) or `test/Transforms/<name>.mlir` (transforms).
"""

import importlib

_REGISTRY: dict[str, tuple[str, str]] = {
    "spyre-convert-linalg": ("convert_linalg", "ConvertLinalgPass"),
}


def pass_names() -> list[str]:
    return sorted(_REGISTRY)


def get_pass_class(name: str):
    """The pass class registered under `name`, or None."""
    entry = _REGISTRY.get(name)
    if entry is None:
        return None
    module = importlib.import_module(f"{__name__}.{entry[0]}")
    return getattr(module, entry[1])


def create_pass(name: str, options: dict[str, str] | None = None):
    cls = get_pass_class(name)
    if cls is None:
        raise KeyError(name)
    return cls.from_options(options or {})
