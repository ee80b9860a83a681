"""Regenerate the protobuf and gRPC modules from moeplane.proto (``make proto``).

``python -m controlplane.wire.generate`` writes ``moeplane_pb2.py``, ``moeplane_pb2.pyi`` and
``moeplane_pb2_grpc.py`` beside the .proto. ``--check DIR`` writes into DIR instead, which the
staleness test uses to compare against the committed files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

WIRE_DIR = Path(__file__).resolve().parent
ROOT = WIRE_DIR.parent.parent
PROTO = WIRE_DIR / "moeplane.proto"
GENERATED = ("moeplane_pb2.py", "moeplane_pb2.pyi", "moeplane_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc with the import root at the repository, so generated imports are absolute.

    Returns the paths of the generated files under ``out_root/controlplane/wire``.
    """
    from grpc_tools import protoc  # only needed at generation time (dev extra)

    rel = PROTO.relative_to(ROOT)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(rel),
    ]
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = protoc.main(args)
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise RuntimeError(f"protoc failed with status {rc}")
    return [out_root / "controlplane" / "wire" / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, WIRE_DIR / path.name)
            print(f"wrote {WIRE_DIR / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
