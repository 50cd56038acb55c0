"""The agent's grep, glob and reads on files of any size, and what they report (review 29, 1-3).

grep used to skip files over 8 MiB and binary files without a word, even the file ``path`` named;
glob and grep stopped at ``max_results`` silently; a paged text read or a byte read of a file over
64 MiB was refused whole. These run the agent's own modules on real files (grep in its forked
child, as in a box)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from execbox.agent import fileops, search

MiB = 1024 * 1024


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def _numbers(path: Path, count: int) -> None:
    """``1\\n2\\n...count\\n``, as ``seq 1 count`` writes it."""
    with open(path, "wb") as f:
        step = 100_000
        for start in range(1, count + 1, step):
            f.write("".join(f"{i}\n" for i in range(start, min(start + step, count + 1))).encode())


def test_grep_searches_a_file_over_the_old_8_mib_skip_named_or_walked(ws: Path) -> None:
    _numbers(ws / "mid.log", 2_000_000)  # 14.8 MB, as in the review
    assert (ws / "mid.log").stat().st_size > 8 * MiB
    for path in ("mid.log", "."):
        out = search.grep(str(ws), "^1234567$", path)
        assert out["matches"] == [{"path": "mid.log", "line_number": 1234567, "line": "1234567"}], path
        assert out["truncated"] is False and "skipped" not in out


def test_a_binary_file_that_matches_is_named_and_one_that_does_not_is_not(ws: Path) -> None:
    (ws / "hit.bin").write_bytes(b"\x00\x01 secret=42 \xff\n")
    (ws / "miss.bin").write_bytes(b"\x00\x01 nothing here\n")
    (ws / "t.txt").write_text("secret=1\n")
    out = search.grep(str(ws), r"secret=\d+")
    assert out["binary_matches"] == ["hit.bin"]
    assert out["matches"] == [{"path": "t.txt", "line_number": 1, "line": "secret=1"}]
    named = search.grep(str(ws), "secret", "hit.bin")  # named: GNU grep's "Binary file hit.bin matches"
    assert named["binary_matches"] == ["hit.bin"] and named["matches"] == []


def test_files_that_cannot_be_searched_are_listed_and_a_named_one_is_an_error(ws: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "ok.txt").write_text("needle\n")
    os.mkfifo(ws / "d" / "pipe")
    out = search.grep(str(ws), "needle", "d")
    assert out["matches"] == [{"path": "d/ok.txt", "line_number": 1, "line": "needle"}]
    assert out["skipped"] == [{"path": "d/pipe", "reason": "not_regular"}]
    with pytest.raises(fileops.FileOpError) as e:
        search.grep(str(ws), "needle", "d/pipe", timeout=5)
    assert e.value.status == 400 and "FIFO" in str(e.value)


def test_a_line_longer_than_a_piece_is_searched_and_reported(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "LINE_PIECE", 64 * 1024)  # the child is forked: it sees these
    monkeypatch.setattr(fileops, "CHUNK", 16 * 1024)
    (ws / "min.json").write_bytes(b"x" * (3 * 64 * 1024 + 10) + b"NEEDLE" + b"y" * 100 + b"\nlast NEEDLE\n")
    out = search.grep(str(ws), "NEEDLE", "min.json")
    assert [m["line_number"] for m in out["matches"]] == [1, 2]
    assert all(len(m["line"]) <= search.MAX_LINE_CHARS for m in out["matches"])
    assert out["skipped"] == [{"path": "min.json", "reason": "long_line"}]


def test_grep_and_glob_say_when_they_stopped_at_max_results(ws: Path) -> None:
    (ws / "many").mkdir()
    for i in range(5):
        (ws / "many" / f"{i}.txt").write_text("1\n1\n")
    assert search.grep(str(ws), "1", max_results=10)["truncated"] is False  # exactly 10: complete
    out = search.grep(str(ws), "1", max_results=9)
    assert len(out["matches"]) == 9 and out["truncated"] is True
    assert search.glob(str(ws), "many/*.txt", 5) == {"paths": [f"many/{i}.txt" for i in range(5)],
                                                     "truncated": False}
    capped = search.glob(str(ws), "many/*.txt", 3)
    assert capped == {"paths": ["many/0.txt", "many/1.txt", "many/2.txt"], "truncated": True}


LINES = ["alpha beta", "", "  indented", "beta", "car\rriage", "trailing space ", "ünïcödé", "a\tb", "x" * 50, "end"]
PATTERNS = [r"^beta$", r"beta$", r"^$", r"\Abeta", r"beta\Z", r"^(?!alpha).*a", r"(?<!\n)^\s+\w", r"a\s*$",
            r"\s$", r"[^a]*+b", r"(?>a|ab)c?", r"(?x) b e t a", r"(?i)ALPHA", r"\bb", r"[\s\S]*end",
            r"(?s).*beta", r"x{50}", r"(?m)^end$"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_chunk_wide_search_finds_exactly_the_lines_a_line_by_line_search_finds(ws: Path, pattern: str) -> None:
    """grep tries a chunk of lines at once where that cannot miss a line's match, line by line
    otherwise (\\A, \\Z, negative lookarounds, atomic, possessive, verbose): both give what
    searching each line on its own gives."""
    (ws / "f.txt").write_bytes(("\r\n".join(LINES) + "\n").encode())
    rx = re.compile(pattern)
    expect = [n for n, line in enumerate(LINES, 1) if rx.search(line)]
    got = [m["line_number"] for m in search.grep(str(ws), pattern, "f.txt", max_results=1000)["matches"]]
    assert got == expect


def test_a_paged_read_of_a_file_over_64_mib_reads_only_its_page(ws: Path) -> None:
    _numbers(ws / "big.log", 9_000_000)  # ~76 MB
    assert (ws / "big.log").stat().st_size > fileops.MAX_READ_BYTES
    page = fileops.read_text(str(ws), "big.log", 10, 3)
    assert page["content"] == "11\n12\n13\n" and page["total_lines"] == 9_000_000 and page["truncated"]
    tail = fileops.read_text(str(ws), "big.log", 8_999_998, 5)
    assert tail["content"] == "8999999\n9000000\n" and not tail["truncated"]
    past = fileops.read_text(str(ws), "big.log", 9_500_000, 5)
    assert past["content"] == "" and past["total_lines"] == 9_000_000 and not past["truncated"]


def test_lines_end_at_newline_and_the_count_stops_at_its_budget(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\x0cstill two\r\nthree")
    page = fileops.read_text(str(ws), "crlf.txt", 1, 1)
    assert page["content"] == "two\x0cstill two\r\n" and page["total_lines"] == 3  # as grep -n and wc -l count
    assert search.grep(str(ws), "three", "crlf.txt")["matches"][0]["line_number"] == 3
    (ws / "win.txt").write_bytes(b"x\r\nbeta\r\n")  # the last line before a chunk's cut ends in \r\n
    assert search.grep(str(ws), "^beta$", "win.txt")["matches"] == [
        {"path": "win.txt", "line_number": 2, "line": "beta"}]
    _numbers(ws / "n.txt", 100_000)
    monkeypatch.setattr(fileops, "LINE_COUNT_MAX_BYTES", 1000)
    counted = fileops.read_text(str(ws), "n.txt", 0, 10)
    assert counted["truncated"] and 10 < counted["total_lines"] < 100_000  # a lower bound past the budget


def test_a_byte_range_of_any_file_and_the_413_of_a_whole_one_says_its_limit_and_size(ws: Path) -> None:
    data = bytes(range(256)) * 4
    (ws / "b.bin").write_bytes(data)
    assert fileops.read_range(str(ws), "b.bin", 10, 20) == (data[10:30], 1024)
    assert fileops.read_range(str(ws), "b.bin", 1000, 100) == (data[1000:], 1024)  # fewer at the end
    assert fileops.read_range(str(ws), "b.bin", 1024, 5) == (b"", 1024)
    assert fileops.read_range(str(ws), "b.bin", 0, 0) == (b"", 1024)  # just the size
    for kwargs, field in (({"offset": 1025}, "offset"), ({"offset": -1}, "offset"), ({"length": -3}, "length"),
                          ({"length": 2000, "max_bytes": 1000}, "length")):
        with pytest.raises(fileops.FileOpError) as e:
            fileops.read_range(str(ws), "b.bin", **kwargs)
        assert e.value.status == 400 and e.value.details["field"] == field, kwargs
    with pytest.raises(fileops.FileOpError) as big:
        fileops.read_range(str(ws), "b.bin", max_bytes=1000)
    assert big.value.status == 413 and big.value.details == {"path": "b.bin", "size": 1024, "limit": 1000}
    assert fileops.read_range(str(ws), "b.bin", 24, max_bytes=1000) == (data[24:], 1024)  # the rest fits
