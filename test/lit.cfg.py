# lit configuration for spyre-mlir: FileCheck tests of the dialect, passes, tools and Python API.
import os
import shutil
import sys

import lit.formats

config.name = "spyre-mlir"
# lit >= 23 rejects execute_external=True; the internal shell is enough for RUN lines.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "..", "build", "lit")
# pytest suites live in unit/; lit.cfg.py itself is not a test.
config.excludes = ["opdb", "models", "shapes", "unit", "lit.cfg.py", "Inputs", "conftest.py"]

bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bin_dir, config.environment.get("PATH", os.environ["PATH"])])
config.environment["PYTHONDONTWRITEBYTECODE"] = "1"

for tool in ("spyre-opt", "filecheck"):
    if not shutil.which(tool, path=config.environment["PATH"]):
        lit_config.fatal(f"'{tool}' not found next to {sys.executable}: run `make setup` first")
config.substitutions.append(("%PYTHON", sys.executable))
config.substitutions.append(("FileCheck", "filecheck"))
config.available_features.add("spyre-opt")

# A hung test must not hold CI for its whole budget.
config.maxIndividualTestTime = int(os.environ.get("SPYRE_LIT_TIMEOUT", "300"))
