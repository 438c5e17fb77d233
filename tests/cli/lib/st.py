"""tests/cli/lib/st.py - a minimal safetensors writer for the CLI tests' inputs
(the format: an 8-byte little-endian header length, a JSON header padded with
spaces to 8 bytes, the tensors' bytes).  Imported by the tests' inline Python
(sys.path gets tests/cli/lib; the scripts run from the repository root)."""
import json
import os
import struct

_FMT = {"F32": "f", "F16": "e"}


def write(folder, path, tensors):
    """Writes folder/path holding `tensors`: (name, dtype, shape, values), values a
    list of numbers (packed as the dtype: F32 or F16) or bytes (written as they are,
    e.g. BF16 or U8 bit patterns)."""
    hdr, blobs, off = {}, [], 0
    for name, dt, shape, vals in tensors:
        if isinstance(vals, (bytes, bytearray)):
            b = bytes(vals)
        elif dt in _FMT:
            b = struct.pack("<%d%s" % (len(vals), _FMT[dt]), *vals)
        else:
            b = bytes(vals)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    j = json.dumps(hdr).encode()
    j += b" " * (-len(j) % 8)
    with open(os.path.join(folder, path), "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
