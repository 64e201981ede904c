"""What a GPU measured in the lectures, shown where none is (the simulator measures no time).

A lecture's measurement cell passes what it measured through `value(key, v)` or `table(key, title, header, rows)`:

- on a GPU the cell shows its own numbers; when the environment variable FP8LAB_RECORD names a JSON file (as
  `scripts/site.py execute --record PATH` does), they are also written there under `key`, with the device, the
  date and the software versions;
- under the simulator (nothing timed) the cell shows the numbers recorded for `key` in fp8lab/data/h200_lectures.json,
  labelled with that device and date.

So a learner on a laptop sees what the course's GPU run measured next to "not measured here", and re-recording is
one run of the lectures on a GPU: `make executed RECORD=fp8lab/data/h200_lectures.json`.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile

from .. import bench
from ..device import hardware, runtime

RECORD_ENV = "FP8LAB_RECORD"
DATA = "h200_lectures"  # fp8lab/data/<DATA>.json, shown under the simulator


def _check_key(key) -> str:
    if not isinstance(key, str) or not key.strip():
        raise TypeError(f"key must be a non-empty string such as '04.tile_quantize', got {key!r}")
    return key


def lookup(key: str) -> dict:
    """The entry recorded for `key`: {"value", "device", "date", "software"}."""
    entries = hardware.recorded(DATA)["entries"]
    if _check_key(key) not in entries:
        raise KeyError(f"nothing recorded for {key!r} in fp8lab/data/{DATA}.json (recorded: {sorted(entries)}); "
                       "run the lecture on a GPU with FP8LAB_RECORD set to record it")
    return entries[key]


def label(entry: dict) -> str:
    return f"recorded on the {entry['device']}, {entry['date']}"


def _record(key: str, value) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path or runtime.IS_SIM:
        return
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"how": "measurement cells of the lectures, run on a GPU by `scripts/site.py execute --backend gpu "
                       "--record PATH` (fp8lab.course.recorded)", "entries": {}}
    data["entries"][key] = {"value": value, "device": bench.device_label(),
                            "date": datetime.date.today().isoformat(), "software": bench.software_versions()}
    data["entries"] = dict(sorted(data["entries"].items()))
    # write beside, then rename: a run stopped half-way never leaves a truncated file
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def value(key: str, measured, why: str = "simulator"):
    """`measured` when this machine measured it (recorded under `key` when FP8LAB_RECORD is set); when it could not
    (`measured` is None: the simulator, or no PyTorch for a peer), the value recorded for `key` on a GPU, after a
    line saying so (`why`) and where and when it was measured. Values are what JSON holds."""
    _check_key(key)
    if measured is None:
        entry = lookup(key)
        print(f"not measured here ({why}); {label(entry)}:")
        return entry["value"]
    json.dumps(measured)  # fails now, not at the end of a recording run, if it cannot be stored
    _record(key, measured)
    return measured


def table(key: str, title: str | None = None, header: list[str] | None = None, rows: list[list] | None = None) -> None:
    """Print a table this machine measured (recorded under `key` when FP8LAB_RECORD is set). Without one (`rows`
    None: the simulator, where nothing is timed) print the table recorded for `key` on a GPU instead, labelled."""
    _check_key(key)
    if rows is None:
        entry = lookup(key)
        t = entry["value"]
        print(f"Not measured here ({'simulator' if runtime.IS_SIM else 'nothing timed'}); {label(entry)}:")
        bench.print_table(t["title"], t["header"], t["rows"])
        return
    if not isinstance(title, str) or not header or len(header) != len(rows[0] if rows else header):
        raise ValueError(f"table {key!r}: title must be a string and header one name per column, got title "
                         f"{title!r}, header {header!r}")
    rows = [[str(c) for c in r] for r in rows]
    bench.print_table(title, header, rows)
    _record(key, {"title": title, "header": list(header), "rows": rows})
