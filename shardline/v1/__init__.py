"""The wire contracts: code generated from proto/shardline/v1/*.proto by scripts/gen_protos.py.

Never edit the *_pb2* files by hand; change the .proto and regenerate (a test fails on drift).
The generator drops protoc's "runtime >= the protoc that generated me" assertion; the real
minimum of the emitted code is checked here instead, once, with a message that says what to do.
"""

import re as _re

from google.protobuf import __version__ as _protobuf_version

MIN_PROTOBUF_VERSION = (5, 26, 1)

if tuple(int(part) for part in _re.findall(r"\d+", _protobuf_version)[:3]) < MIN_PROTOBUF_VERSION:
    raise ImportError(
        f"shardline.v1 needs protobuf>={'.'.join(map(str, MIN_PROTOBUF_VERSION))}, "
        f"found {_protobuf_version}; run `pip install -U 'protobuf>=5.26.1'`")
