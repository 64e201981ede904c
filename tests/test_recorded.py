"""fp8lab.course.recorded: what the lectures' GPU run measured, shown under the simulator."""

import json
import re
from pathlib import Path

import pytest

from fp8lab.device import hardware, runtime
from fp8lab.course import recorded

ROOT = Path(__file__).resolve().parents[1]
USE = re.compile(r"""recorded\.(?:value|table|lookup)\(\s*["']([^"']+)["']""")


def keys_used() -> dict:
    """{key: [notebooks]} of every recorded figure a lecture asks for."""
    used = {}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for key in USE.findall("".join(cell["source"])):
                    used.setdefault(key, []).append(nb.name)
    return used


def test_every_key_a_lecture_shows_was_recorded_on_a_gpu():
    used = keys_used()
    assert len(used) >= 10, f"the lectures should show their GPU figures through fp8lab.course.recorded: {sorted(used)}"
    entries = hardware.recorded(recorded.DATA)["entries"]
    missing = sorted(set(used) - set(entries))
    assert not missing, f"not recorded: {missing} (used by {[used[k] for k in missing]})"
    for key in used:
        e = entries[key]
        assert "H200" in e["device"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", e["date"]), (key, e["device"], e["date"])
        assert e["value"] is not None and e["software"], key
    # each lecture 00-06 that times something shows a recorded figure
    assert {k.split(".")[0] for k in used} >= {"00", "01", "02", "03", "04", "05", "06"}


def test_tables_hold_rows_that_match_their_header():
    for key, e in hardware.recorded(recorded.DATA)["entries"].items():
        v = e["value"]
        if isinstance(v, dict) and "rows" in v:
            assert v["rows"] and all(len(r) == len(v["header"]) for r in v["rows"]), key
            assert not any("not measured" in c for r in v["rows"] for c in r), f"{key}: recorded without timings"


@pytest.fixture
def on_a_fake_gpu(monkeypatch, tmp_path):
    path = tmp_path / "rec.json"
    monkeypatch.setenv(recorded.RECORD_ENV, str(path))
    monkeypatch.setattr(runtime, "IS_SIM", False)
    monkeypatch.setattr(runtime, "device_info", lambda: {"name": "Test GPU", "sms": 7, "cc": "9.0"})
    return path


def test_a_gpu_run_records_values_and_tables(on_a_fake_gpu, capsys):
    assert recorded.value("99.x", {"ms": 1.5}) == {"ms": 1.5}
    recorded.table("99.t", "a title", ["kernel", "time"], [["v1", 0.25], ["v2", "1 ms"]])
    assert "a title" in capsys.readouterr().out
    recorded.value("99.x", {"ms": 2.5})  # a second run replaces the first
    data = json.loads(on_a_fake_gpu.read_text())
    assert data["entries"]["99.x"]["value"] == {"ms": 2.5}
    assert data["entries"]["99.x"]["device"] == "Test GPU (7 SMs, cc 9.0)"
    assert data["entries"]["99.t"]["value"] == {"title": "a title", "header": ["kernel", "time"],
                                                "rows": [["v1", "0.25"], ["v2", "1 ms"]]}
    assert not list(on_a_fake_gpu.parent.glob("*.tmp")), "the temporary file was renamed into place"


def test_without_a_measurement_the_recorded_figure_is_shown_and_labelled(capsys):
    key = next(iter(hardware.recorded(recorded.DATA)["entries"]))
    got = recorded.value(key, None)
    assert got == recorded.lookup(key)["value"]
    out = capsys.readouterr().out
    assert "not measured here (simulator)" in out and "recorded on the" in out and "H200" in out


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="key must be a non-empty string"):
        recorded.value("", 1.0)
    with pytest.raises(KeyError, match="nothing recorded for 'no.such_key'"):
        recorded.value("no.such_key", None)
    with pytest.raises(TypeError, match="key must be"):
        recorded.table(None)


def test_table_header_must_fit_rows(on_a_fake_gpu):
    with pytest.raises(ValueError, match="header one name per column"):
        recorded.table("99.t", "title", ["only one"], [["a", "b"]])
    with pytest.raises(TypeError):  # not JSON: caught before a long recording run ends
        recorded.value("99.y", {1, 2})
