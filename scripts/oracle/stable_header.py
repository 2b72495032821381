"""Make a safetensors file byte-reproducible: sort its __metadata__ keys in place.

The safetensors writer keeps __metadata__ in a hash map, so its key order (and hence the
file's bytes) changes from run to run. Rewriting the header with sorted metadata keeps the
header length and every data offset unchanged.
"""

import json
import pathlib
import struct


def sort_metadata_in_place(path: pathlib.Path) -> None:
    with open(path, "r+b") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        raw = file.read(length)
        header = json.loads(raw, object_pairs_hook=dict)
        if "__metadata__" not in header:
            return
        ordered = {"__metadata__": dict(sorted(header.pop("__metadata__").items()))}
        ordered.update(header)
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:
            raise ValueError(f"{path}: re-serialised header is longer than the original")
        file.seek(8)
        file.write(text + b" " * (length - len(text)))
