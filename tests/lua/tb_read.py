"""tb_read.py: an independent reader of TensorBoard event files, Python standard library only.

    python3 tests/lua/tb_read.py FILE...  ->  one JSON object per Event on stdout:
    {"wall_time": .., "step": .., "file_version": .., "scalars": {tag: value}, "session_start": bool}

Written from the format's description (TFRecord framing: uint64 length, masked CRC-32C of the
length, payload, masked CRC-32C of the payload; Event/Summary protobufs), not from remax's
writer: CRC-32C is computed bit by bit here, protobuf fields are decoded generically. A bad CRC,
a cut record or an unknown wire type is an error (exit 1) naming the file and offset.
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """(field number, wire type, value) of a protobuf message; value is int, bytes or raw bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def event(payload):
    out = {"scalars": {}, "session_start": False}
    for num, wt, v in fields(payload):
        if num == 1 and wt == 1:
            out["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            out["step"] = v
        elif num == 3 and wt == 2:
            out["file_version"] = v.decode()
        elif num == 5 and wt == 2:  # Summary
            for snum, swt, sv in fields(v):
                if snum == 1 and swt == 2:  # Value
                    tag, value = None, None
                    for vnum, vwt, vv in fields(sv):
                        if vnum == 1 and vwt == 2:
                            tag = vv.decode()
                        elif vnum == 2 and vwt == 5:
                            value = struct.unpack("<f", vv)[0]
                    out["scalars"][tag] = value
        elif num == 6 and wt == 2:  # SessionLog
            for lnum, lwt, lv in fields(v):
                if lnum == 1 and lwt == 0 and lv == 1:
                    out["session_start"] = True
    return out


def main(paths):
    for path in paths:
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            if pos + 12 > len(data):
                sys.exit("%s: record header cut at offset %d" % (path, pos))
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
            if hcrc != masked(header):
                sys.exit("%s: bad length CRC at offset %d" % (path, pos))
            payload = data[pos + 12:pos + 12 + length]
            if len(payload) != length or pos + 16 + length > len(data):
                sys.exit("%s: record cut at offset %d" % (path, pos))
            (pcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
            if pcrc != masked(payload):
                sys.exit("%s: bad payload CRC at offset %d" % (path, pos))
            e = event(payload)
            e["file"] = path
            print(json.dumps(e, allow_nan=True))
            pos += 16 + length


if __name__ == "__main__":
    main(sys.argv[1:])
