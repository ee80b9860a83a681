"""Regenerate the protobuf and gRPC modules from moeplane.proto (``make proto``).

``python -m moeplane.controlplane.wire.generate`` writes ``moeplane_pb2.py``, ``moeplane_pb2.pyi`` and
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
MODULE_PATH = ("moeplane", "controlplane", "wire")
PROTO = WIRE_DIR / "moeplane.proto"
GENERATED = ("moeplane_pb2.py", "moeplane_pb2.pyi", "moeplane_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc on a copy of the .proto laid out as its installed module path, so the generated
    imports are ``moeplane.controlplane.wire...``.

    Returns the paths of the generated files under ``out_root/moeplane/controlplane/wire``.
    """
    from grpc_tools import protoc  # only needed at generation time (dev extra)

    with tempfile.TemporaryDirectory() as src_root:
        rel = Path(*MODULE_PATH) / PROTO.name
        (Path(src_root) / rel).parent.mkdir(parents=True)
        shutil.copyfile(PROTO, Path(src_root) / rel)
        args = [
            "protoc",
            f"-I{src_root}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(Path(src_root) / rel),
        ]
        rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with status {rc}")
    return [out_root.joinpath(*MODULE_PATH, name) for name in GENERATED]


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
