"""File operations a user can turn against the box's agent, on real jail boxes: a batch that cannot
be written leaves the workspace as it was, removing a symlink removes the link, a FIFO is refused
at once, a catastrophic regex times out while the box lives on, bad argument types are requests
errors without the agent's traceback."""

from __future__ import annotations

import time

import pytest

from execbox.errors import ExecutionTimeoutError, InvalidConfigError

from .conftest import run

pytestmark = pytest.mark.jail


def _call(jail, box: str, op: str, params: dict):  # noqa: ANN001 - the agent op itself, as the host sends it
    return jail._call(jail._get(box), op, params)


def test_batch_that_cannot_be_written_changes_nothing(jail, box):
    jail.write_file(box, "config.json", "OLD")
    for files in ({"config.json": "NEW", "n" * 256: "x"}, {"config.json": "NEW2", "f": "file", "f/g": "x"},
                  {"config.json": "NEW3", "made/x": "1", "config.json/y": "2"}):
        with pytest.raises(InvalidConfigError) as e:
            jail.write_files(box, files)
        assert e.value.http_status == 400 and ".execbox" not in str(e.value) and "/workspace" not in str(e.value)
    with pytest.raises(InvalidConfigError) as single:
        jail.write_file(box, "y" * 300, "A" * 1000)
    assert single.value.http_status == 400
    assert jail.read_file(box, "config.json").content == "OLD"
    r = run(jail, box, "ls -A", "bash")
    assert set(r.stdout.split()) - {"artifacts"} == {"config.json"}, r.stdout  # no temp files, no directories made


def test_removing_a_symlink_removes_the_link_not_its_target(jail, box):
    r = run(jail, box, "mkdir -p data && echo precious > data/db.txt && ln -s data cache && "
                       "ln -s data/db.txt link.txt && ln -s /etc/passwd out", "bash")
    assert r.exit_code == 0, r.stderr
    jail.delete_path(box, "link.txt")
    jail.delete_path(box, "cache")
    assert jail.move_path(box, "out", "out2") == "out2"  # a link pointing out: renamed, never followed
    jail.delete_path(box, "out2")
    r = run(jail, box, "ls -A; cat data/db.txt", "bash")
    assert set(r.stdout.split()) - {"artifacts"} == {"data", "precious"}, r.stdout


def test_a_listing_shows_symlinks_as_links_without_following_them(jail, box):
    r = run(jail, box, "mkdir -p data && echo precious > data/db.txt && ln -s data/db.txt link.txt && "
                       "ln -s /etc/passwd out && ln -s data cache", "bash")
    assert r.exit_code == 0, r.stderr
    found = {f.path: f for f in jail.list_files(box, ".")}
    assert (found["link.txt"].symlink_target, found["link.txt"].size) == ("data/db.txt", len("data/db.txt"))
    assert found["out"].symlink_target == "/etc/passwd" and not found["out"].is_dir
    assert found["cache"].symlink_target == "data" and not found["cache"].is_dir  # the link, not the dir
    assert found["data"].symlink_target is None and found["data"].is_dir


def test_fifo_is_refused_at_once_and_the_box_lives_on(jail, box):
    assert run(jail, box, "mkfifo p && mkdir d && mkfifo d/q && echo hello > d/h.txt", "bash").exit_code == 0
    start = time.monotonic()
    for attempt in (lambda: jail.read_file(box, "p"), lambda: jail.read_bytes(box, "d/q"),
                    lambda: jail.write_file(box, "p", "x", mode="append")):
        with pytest.raises(InvalidConfigError) as e:
            attempt()
        assert e.value.http_status == 400 and "FIFO" in str(e.value)
    assert [m.path for m in jail.grep(box, "hel", "d")] == ["d/h.txt"]
    assert time.monotonic() - start < 10
    assert run(jail, box, "print(6 * 7)").stdout == "42\n"


def test_catastrophic_regex_times_out_and_the_box_lives_on(jail, box):
    jail.write_file(box, "r.txt", "a" * 60 + "!\n")
    ctx = run(jail, box, "x = 41", context_id="c1")
    assert ctx.exit_code == 0
    start = time.monotonic()
    with pytest.raises(ExecutionTimeoutError):
        _call(jail, box, "files.grep", {"pattern": "(a+)+$", "path": ".", "timeout": 1})
    assert time.monotonic() - start < 10
    assert jail.instance_alive(box)
    r = run(jail, box, "print(x + 1)", context_id="c1")  # the session's context survived
    assert (r.exit_code, r.stdout) == (0, "42\n"), r.stderr
    assert [m.line_number for m in jail.grep(box, "!")] == [1]


@pytest.mark.parametrize(("op", "params"), [
    ("files.read", {"path": "f.txt", "limit": "x"}),
    ("files.read", {"path": "f.txt", "offset": [1]}),
    ("files.read_bytes", {"path": "f.txt", "max_bytes": "big"}),
    ("files.glob", {"pattern": "*", "max_results": "10"}),
    ("files.grep", {"pattern": 5}),
    ("files.grep", {"pattern": "x", "glob": 7}),
    ("files.grep", {"pattern": "x", "timeout": "soon"}),
    ("files.write", {"path": "g.txt", "content": "x", "mode": 3}),
    ("files.write", {"path": "g.txt", "content_b64": 12}),
    ("files.write_many", {"files": ["g.txt"]}),
    ("files.move", {"source": 5, "destination": "x"}),
])
def test_bad_argument_types_are_request_errors(jail, box, op, params):
    jail.write_file(box, "f.txt", "line\n")
    with pytest.raises(InvalidConfigError) as e:
        _call(jail, box, op, params)
    assert e.value.code == "SB002" and e.value.http_status == 400
    assert "traceback" not in (e.value.details or {}) and "Traceback" not in str(e.value)
