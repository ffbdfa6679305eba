"""tb_ref.py: TensorBoard's own reading of event-file folders (tests/lua/report_spec.lua).

    python tests/lua/tb_ref.py DIR...   ->  one JSON object on stdout, {DIR: view, ...}

A view, all of it computed by tensorboard's code:

  "scalars":   {tag: [[step, value, wall_time], ...]}: event_accumulator.EventAccumulator on
               the folder (its files in name order), purge_orphaned_data on as `tensorboard
               --logdir` has it, every value kept (size guidance 0)
  "dashboard": {tag: [[step, value], ...]}: what the Scalars dashboard is served for the folder:
               plugin_event_multiplexer (the accumulator the server runs) read through
               MultiplexerDataProvider.read_scalars, the scalars plugin's own query
  "file_version": the event-file version the accumulator parsed (2.0 for "brain.Event:2"),
               which decides how it treats restarts
  "purges", "dashboard_purges": the warnings each accumulator logs when a SessionLog START
               drops orphaned data ("... current step: S ... Removing N scalars ..."), as
               {"step": S, "removed": N, "message"}
  "read_errors": what TensorBoard's record reader gave up on (a bad CRC, a cut record); it
               logs these at debug level and stops reading the file
  "files":     per event file, in name order, each Event as LegacyEventFileLoader parses it:
               {"step", "wall_time", "what" (the Event's `what` oneof field), "file_version",
                "session_log" (SessionLog status name), "values" ({tag: simple_value})}
"""
import json
import logging
import os
import re
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, io_wrapper
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard import context
from tensorboard.compat.proto import event_pb2


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def raw_events(path):
    out = []
    for e in event_file_loader.LegacyEventFileLoader(path).Load():
        ev = {"step": e.step, "wall_time": e.wall_time, "what": e.WhichOneof("what")}
        if ev["what"] == "file_version":
            ev["file_version"] = e.file_version
        elif ev["what"] == "session_log":
            ev["session_log"] = event_pb2.SessionLog.SessionStatus.Name(e.session_log.status)
        elif ev["what"] == "summary":
            ev["values"] = {v.tag: v.simple_value for v in e.summary.value}
        out.append(ev)
    return out


def logged(fn):
    """fn()'s result and the messages tensorboard's loggers gave meanwhile."""
    log = Collect()
    tb_log = logging.getLogger("tensorboard")
    tb_log.addHandler(log)
    tb_log.setLevel(logging.DEBUG)
    try:
        return fn(), log.records
    finally:
        tb_log.removeHandler(log)


def accumulated(folder):
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0}).Reload()
    return acc, {tag: [[s.step, s.value, s.wall_time] for s in acc.Scalars(tag)]
                 for tag in acc.Tags()[event_accumulator.SCALARS]}


def served(folder):
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(folder)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, folder)
    runs = provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=10 ** 9)
    return {tag: [[d.step, d.value] for d in data] for run in runs.values() for tag, data in run.items()}


def purges(messages):
    """The purge warnings as {"step": the START's step, "removed": values dropped, "message"}."""
    out = []
    for m in messages:
        if "Detected out of order event.step" in m:
            removed = re.search(r"Removing (\d+) scalars|Purging (\d+) expired", m)
            out.append({"step": int(re.search(r"current step: (-?\d+)", m).group(1)),
                        "removed": int(removed.group(1) or removed.group(2)), "message": m})
    return out


def view(folder):
    (acc, scalars), acc_log = logged(lambda: accumulated(folder))
    dashboard, served_log = logged(lambda: served(folder))
    names = sorted(n for n in os.listdir(folder) if io_wrapper.IsSummaryEventsFile(os.path.join(folder, n)))
    files = [{"name": n, "events": raw_events(os.path.join(folder, n))} for n in names]
    return {"scalars": scalars, "dashboard": dashboard, "file_version": acc.file_version, "files": files,
            "purges": purges(acc_log), "dashboard_purges": purges(served_log),
            "read_errors": [m for m in acc_log + served_log if "Truncated record" in m or "crc32 check" in m]}


if __name__ == "__main__":
    json.dump({d: view(d) for d in sys.argv[1:]}, sys.stdout)
