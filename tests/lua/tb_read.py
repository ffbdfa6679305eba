"""tb_read.py: an independent reader of TensorBoard event files, Python standard library only.

    python3 tests/lua/tb_read.py FILE...       ->  one JSON object per Event on stdout:
        {"wall_time": .., "step": .., "file_version": .., "scalars": {tag: value},
         "session_start": bool, "file": path}
    python3 tests/lua/tb_read.py --scalars DIR ->  one JSON object {tag: [[step, value], ...]}:
        the scalars TensorBoard shows for the folder, after its purge of orphaned data

Written from TensorBoard's published schema, not from remax's writer. The messages, as
tensorboard/compat/proto/event.proto and summary.proto declare them (only the fields read here):

    message Event {
      double wall_time = 1;                       // wire type 1 (64-bit)
      int64 step = 2;                             // wire type 0 (varint)
      oneof what {
        string file_version = 3;                  // wire type 2 (length-delimited)
        bytes graph_def = 4;
        Summary summary = 5;                      // wire type 2
        LogMessage log_message = 6 [deprecated = true];
        SessionLog session_log = 7;               // wire type 2
        TaggedRunMetadata tagged_run_metadata = 8;
        bytes meta_graph_def = 9;
      }
    }
    message SessionLog {
      enum SessionStatus { STATUS_UNSPECIFIED = 0; START = 1; STOP = 2; CHECKPOINT = 3; }
      SessionStatus status = 1;                   // wire type 0
      string checkpoint_path = 2;
      string msg = 3;
    }
    message Summary {
      message Value {
        string node_name = 7;
        string tag = 1;                           // wire type 2
        SummaryMetadata metadata = 9;
        oneof value {
          float simple_value = 2;                 // wire type 5 (32-bit)
          ...
        }
      }
      repeated Value value = 1;                   // wire type 2
    }

Framing (TFRecord): uint64 length (little-endian), masked CRC-32C of those 8 bytes, the payload,
masked CRC-32C of the payload; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. CRC-32C is
computed bit by bit here. A bad CRC, a cut record or an unknown wire type is an error (exit 1)
naming the file and offset. A field at a known number with the wrong wire type is an error too,
so a writer that puts a message where the schema has another type cannot pass.

Purge (TensorBoard's EventAccumulator, purge_orphaned_data on by default): the files of a folder
are read in name order; an Event whose session_log.status is START at step s discards every
scalar read so far with step >= s (a restarted job re-runs those steps).
"""
import json
import os
import struct
import sys

# field number -> (name, wire type), from the proto text above
EVENT_FIELDS = {1: ("wall_time", 1), 2: ("step", 0), 3: ("file_version", 2), 4: ("graph_def", 2),
                5: ("summary", 2), 6: ("log_message", 2), 7: ("session_log", 2),
                8: ("tagged_run_metadata", 2), 9: ("meta_graph_def", 2)}
SESSION_LOG_FIELDS = {1: ("status", 0), 2: ("checkpoint_path", 2), 3: ("msg", 2)}
SESSION_START = 1  # SessionLog.SessionStatus.START
SUMMARY_FIELDS = {1: ("value", 2)}
VALUE_FIELDS = {7: ("node_name", 2), 1: ("tag", 2), 9: ("metadata", 2), 2: ("simple_value", 5)}


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


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf, schema, what):
    """(name, value) of a protobuf message, checked against its schema {number: (name, wire type)}."""
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
            raise ValueError("%s: wire type %d" % (what, wt))
        if num in schema:
            name, want = schema[num]
            if wt != want:
                raise ValueError("%s.%s (field %d): wire type %d, the proto says %d" % (what, name, num, wt, want))
            yield name, v


def event(payload):
    out = {"scalars": {}, "session_start": False}
    for name, v in fields(payload, EVENT_FIELDS, "Event"):
        if name == "wall_time":
            out["wall_time"] = struct.unpack("<d", v)[0]
        elif name == "step":
            out["step"] = v - (1 << 64) if v >= (1 << 63) else v
        elif name == "file_version":
            out["file_version"] = v.decode()
        elif name == "summary":
            for _, sv in fields(v, SUMMARY_FIELDS, "Summary"):
                tag, value = None, None
                for vname, vv in fields(sv, VALUE_FIELDS, "Summary.Value"):
                    if vname == "tag":
                        tag = vv.decode()
                    elif vname == "simple_value":
                        value = struct.unpack("<f", vv)[0]
                out["scalars"][tag] = value
        elif name == "session_log":
            for lname, lv in fields(v, SESSION_LOG_FIELDS, "SessionLog"):
                if lname == "status" and lv == SESSION_START:
                    out["session_start"] = True
        elif name == "log_message":
            out["log_message"] = True
    return out


def read_file(path):
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
        try:
            e = event(payload)
        except ValueError as err:
            sys.exit("%s: offset %d: %s" % (path, pos, err))
        e["file"] = path
        yield e
        pos += 16 + length


def scalars(folder):
    """{tag: [[step, value], ...]} as TensorBoard keeps them, files in name order, START purging."""
    names = sorted(n for n in os.listdir(folder) if "tfevents" in n)
    kept = {}
    for n in names:
        for e in read_file(os.path.join(folder, n)):
            if e["session_start"] and "step" in e:
                s = e["step"]
                for tag in kept:
                    kept[tag] = [sv for sv in kept[tag] if sv[0] < s]
            for tag, value in e["scalars"].items():
                kept.setdefault(tag, []).append([e.get("step", 0), value])
    return kept


def main(args):
    if args and args[0] == "--scalars":
        print(json.dumps(scalars(args[1]), allow_nan=True))
        return
    for path in args:
        for e in read_file(path):
            print(json.dumps(e, allow_nan=True))


if __name__ == "__main__":
    main(sys.argv[1:])
