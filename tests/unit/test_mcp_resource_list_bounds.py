"""resources/list's filter (mcp/resource_list.py), review 43 F4: only regular files are offered
(not FIFOs, sockets or devices, which a read refuses), a link whose text the listing lacks (not
UTF-8: kind ``symlink`` without ``symlink_target``) is left out, and the work is lazy and bounded
(box-made chains of long link texts held the API process's CPU for over a minute)."""

from __future__ import annotations

import time

from execbox.mcp import server
from execbox.mcp.resource_list import MAX_STEPS, Steps, iter_readable
from execbox.models import FileInfo


def _f(path: str, kind: str, size: int = 1, target: str | None = None) -> FileInfo:
    return FileInfo(path, size, kind == "dir", 0.0, target, kind)


def test_only_regular_files_and_links_to_them_are_offered() -> None:
    entries = [
        _f("README", "file", 11), _f("fifo", "fifo"), _f("sock", "socket"), _f("tty", "device"), _f("odd", "other"),
        _f("d", "dir", 0), _f("d/f", "file", 3),
        _f("tofifo", "symlink", 4, "fifo"), _f("tosock", "symlink", 4, "sock"),
        _f("bad", "symlink", 10),                          # text not UTF-8: the listing has none
        _f("viabad", "symlink", 9, "bad"), _f("inbad", "symlink", 9, "bad/x"),
        _f("ok", "symlink", 6, "README"), _f("okd", "symlink", 3, "d/f"),
    ]
    assert [(e.path, e.size) for e in iter_readable(entries)] == [("README", 11), ("d/f", 3), ("ok", 11), ("okd", 3)]


def test_a_listing_from_an_older_agent_without_kind_is_filtered_as_before() -> None:
    entries = [FileInfo("a", 1, False, 0.0), FileInfo("l", 1, False, 0.0, "a"), FileInfo("d", 0, True, 0.0)]
    assert [e.path for e in iter_readable(entries)] == ["a", "l"]


def _pathological(n: int) -> list[FileInfo]:
    """review 43's bench_rl.py: a 40-hop chain, and many links with ~5000-character targets to its head."""
    es = [_f("d", "dir", 0), _f("f", "file")]
    es += [_f(f"c{i}", "symlink", 0, f"c{i + 1}" if i < 39 else "f") for i in range(40)]
    long_t = "d/../" * 999 + "c0"
    es += [_f(f"l{i}", "symlink", 0, long_t) for i in range(n - len(es))]
    return es


def test_the_work_of_one_call_is_bounded() -> None:
    es = _pathological(200_000)
    steps = Steps()
    start = time.process_time()
    out = list(iter_readable(es, steps))
    took = time.process_time() - start
    assert took < 5, took  # was ~78 s of CPU
    assert steps.left <= 0 and len(out) == 41  # f and its chain (each l is 41 hops: ELOOP); then spent
    assert [e.path for e in out[:2]] == ["f", "c0"]
    # a budget spent by one session's listing leaves the next one out
    assert list(iter_readable([_f("x", "file")], steps)) == []
    assert MAX_STEPS >= 200_000


def test_it_is_lazy_and_the_server_stops_at_its_cap() -> None:
    es = [_f(f"f{i}", "file") for i in range(200_000)]
    steps = Steps()
    it = iter_readable(es, steps)
    first = [next(it) for _ in range(server.MAX_LISTED_FILES)]
    assert first[-1].path == f"f{server.MAX_LISTED_FILES - 1}"
    assert MAX_STEPS - steps.left <= server.MAX_LISTED_FILES  # nothing past what was taken was looked at


class _Core:
    def __init__(self, files: list[FileInfo]) -> None:
        self.files = files

    def list_sessions(self, caller: object) -> list[dict[str, str]]:
        return [{"session_id": "s1", "state": "running"}, {"session_id": "s2", "state": "running"}]

    def list_running_files(self, caller: object, sid: str) -> list[FileInfo]:
        return self.files


def test_list_files_uses_one_budget_and_stops_at_the_cap() -> None:
    listed = server._list_files(_Core([_f(f"f{i}", "file") for i in range(300)] + [_f("p", "fifo")]), None)
    assert len(listed) == server.MAX_LISTED_FILES and listed[-1].name == "s2/f199"
    assert all(not r.name.endswith("/p") for r in listed)
    start = time.process_time()
    assert [r.name for r in server._list_files(_Core(_pathological(200_000)), None)][:2] == ["s1/f", "s1/c0"]
    assert time.process_time() - start < 5
