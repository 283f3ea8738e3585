#!/usr/bin/env python3
"""Generate the Python code for the wire contracts in proto/ into shardline/v1/.

    python scripts/gen_protos.py           # regenerate shardline/v1/*_pb2*.py(i)
    python scripts/gen_protos.py --check   # exit 1, naming the files, if the committed ones drift

proto/ is the single source of truth; the generated files are committed (so that installing
shardline needs no protoc) and never edited by hand. Output is deterministic for a given
grpcio-tools version: protoc is run once over the sorted .proto list with paths relative to
proto/, so no absolute path or ordering leaks into the files.

One rewrite follows protoc, in both modes: the protobuf runtime-version assertion is taken out of
each *_pb2.py. protoc stamps the gencode with its own version (7.35.1 for grpcio-tools 1.85) and
asserts runtime >= that, same major; yet the code it emits only uses builder APIs that protobuf
has had since 5.26.1 (verified on 5.26.1, 5.29.5, 6.31.1 and 7.x). shardline/v1/__init__.py
checks that minimum instead, so one generation serves every runtime our pin allows.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("shardline") / "v1"  # relative to both proto/ and the repo root
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
_RUNTIME_IMPORT = "from google.protobuf import runtime_version as _runtime_version\n"
_RUNTIME_CHECK = re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:    .*\n)+?\)\n")
_RUNTIME_NOTE = "# protobuf runtime check: shardline/v1/__init__.py (see scripts/gen_protos.py)\n"


def proto_files() -> list[str]:
    return sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc over every proto into out_root/shardline/v1/; returns the generated paths."""
    import grpc_tools
    from grpc_tools import protoc

    protos = proto_files()
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed (exit {rc}) on {protos}")
    for path in (out_root / PACKAGE_DIR).glob("*_pb2.py"):
        path.write_text(drop_runtime_check(path.read_text(), path.name))
    return generated_files(out_root)


def drop_runtime_check(code: str, name: str) -> str:
    """Remove the gencode's runtime-version assertion (see the module docstring)."""
    code, num_calls = _RUNTIME_CHECK.subn(_RUNTIME_NOTE, code)
    if num_calls != 1 or _RUNTIME_IMPORT not in code:
        raise SystemExit(f"{name}: protoc output no longer has the expected runtime-version check; "
                         "update drop_runtime_check() in scripts/gen_protos.py for this grpcio-tools")
    return code.replace(_RUNTIME_IMPORT, "")


def generated_files(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root)
        for p in (root / PACKAGE_DIR).iterdir()
        if p.name.endswith(GENERATED_SUFFIXES)
    )


def check() -> int:
    """Regenerate into a temp dir and compare with the committed files. Returns the exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = set(generate(Path(tmp)))
        committed = set(generated_files(ROOT))
        drifted = sorted(
            str(p) for p in fresh & committed if not filecmp.cmp(Path(tmp) / p, ROOT / p, shallow=False)
        )
        missing = sorted(str(p) for p in fresh - committed)
        stale = sorted(str(p) for p in committed - fresh)
    if not (drifted or missing or stale):
        print(f"generated code in {PACKAGE_DIR} is in sync with {PROTO_ROOT.relative_to(ROOT)}/")
        return 0
    for label, paths in (("differs from proto/", drifted), ("missing", missing), ("has no .proto (stale)", stale)):
        for p in paths:
            print(f"{p}: {label}", file=sys.stderr)
    print("run `python scripts/gen_protos.py` and commit the result", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="fail (exit 1) if the committed generated files differ from a fresh generation")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    for stale in generated_files(ROOT):  # so that a removed .proto leaves no orphan behind
        (ROOT / stale).unlink()
    for p in generate(ROOT):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
