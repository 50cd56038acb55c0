"""A text read's reply stays under the host's frame limit whatever the file holds: control
characters and undecodable bytes take 6 bytes each once JSON-escaped, so 64 MiB of them would be
a 384 MiB frame (which the host refuses as a broken box). The page stops and says truncated."""

from __future__ import annotations

from execbox.agent import fileops
from execbox.agent.lean import dumps


def test_escaped_content_is_bounded_and_marked_truncated(tmp_path, monkeypatch):
    monkeypatch.setattr(fileops, "TEXT_REPLY_MAX", 1 << 20)
    (tmp_path / "ctl.txt").write_bytes(b"\x01" * 4000 + b"\n" * 1 + (b"\x01" * 4000 + b"\n") * 400)  # ~1.6 MB
    (tmp_path / "bad.txt").write_bytes(b"\xff" * (2 << 20))  # one line of undecodable bytes
    for name in ("ctl.txt", "bad.txt"):
        out = fileops.read_text(str(tmp_path), name, 0, 100000)
        assert len(dumps(out["content"])) <= 1 << 20 and out["truncated"], name
        assert out["content"]  # not empty: as much as fits
    (tmp_path / "small.txt").write_text("a\nb\n")
    out = fileops.read_text(str(tmp_path), "small.txt")
    assert out["content"] == "a\nb\n" and not out["truncated"]
