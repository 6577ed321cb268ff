"""The main job: convert a bundled linalg example to the spyre dialect with a mixed upstream/spyre pipeline.

Until the compile-to-binary path lands, this is the furthest the toolchain goes end to end.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = "builtin.module(canonicalize,spyre-convert-linalg,canonicalize,cse)"


def main() -> int:
    src = os.path.join(HERE, "dense_layer.linalg.mlir")
    opt = os.path.join(os.path.dirname(sys.executable), "spyre-opt")
    print(f"$ spyre-opt {os.path.relpath(src)} -p '{PIPELINE}'", flush=True)
    out = subprocess.run([opt, src, "-p", PIPELINE], capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    if out.returncode or "linalg." in out.stdout:
        print("demo: FAILED", file=sys.stderr)
        return 1
    print("demo: every linalg op became a spyre op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
