"""The agent seeds a box's empty matplotlib config dir from the image's font cache, and only that."""

from __future__ import annotations

import os

from execbox.agent import runners


def test_copies_the_font_lists_into_an_empty_config_dir(tmp_path, monkeypatch):
    seed, box = tmp_path / "seed", tmp_path / "tmp"
    seed.mkdir()
    box.mkdir()
    (seed / "fontlist-v330.json").write_text('{"_version": 330}')
    (seed / "other.txt").write_text("not a font list")
    monkeypatch.setenv("EXECBOX_MPL_SEED", str(seed))
    monkeypatch.setenv("MPLCONFIGDIR", str(box))
    runners.seed_matplotlib_cache()
    assert sorted(os.listdir(box)) == ["fontlist-v330.json"]
    assert (box / "fontlist-v330.json").read_text() == '{"_version": 330}'


def test_a_cache_of_the_box_s_own_is_kept_and_a_link_is_not_followed(tmp_path, monkeypatch):
    seed, box, outside = tmp_path / "seed", tmp_path / "tmp", tmp_path / "outside"
    for d in (seed, box):
        d.mkdir()
    (seed / "fontlist-v330.json").write_text("seed")
    (seed / "fontlist-v390.json").write_text("seed")
    (box / "fontlist-v330.json").write_text("own")
    (box / "fontlist-v390.json").symlink_to(outside)  # planted by earlier code in the box
    monkeypatch.setenv("EXECBOX_MPL_SEED", str(seed))
    monkeypatch.setenv("MPLCONFIGDIR", str(box))
    runners.seed_matplotlib_cache()
    assert (box / "fontlist-v330.json").read_text() == "own"
    assert not outside.exists()


def test_no_seed_or_no_config_dir_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_MPL_SEED", str(tmp_path / "missing"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path))
    runners.seed_matplotlib_cache()
    monkeypatch.delenv("MPLCONFIGDIR")
    runners.seed_matplotlib_cache()
    assert os.listdir(tmp_path) == []


def test_a_runtime_without_matplotlib_gets_no_font_cache(tmp_path):
    import subprocess
    import sys

    from execbox.boxes import runtime_build

    work = tmp_path / "v1"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work)], check=True)
    runtime_build.font_cache(str(work))
    assert not (work / "mpl-seed").exists()


def test_seeds_are_tried_in_order_and_the_first_list_of_a_version_wins(tmp_path, monkeypatch):
    runtime_seed, image_seed, box = tmp_path / "rt", tmp_path / "img", tmp_path / "tmp"
    for d in (runtime_seed, image_seed, box):
        d.mkdir()
    (runtime_seed / "fontlist-v3.11.0.json").write_text("runtime")
    (image_seed / "fontlist-v3.11.0.json").write_text("image")
    (image_seed / "fontlist-v330.json").write_text("image 3.6")
    monkeypatch.setenv("EXECBOX_MPL_SEED", f"{runtime_seed}:{tmp_path / 'missing'}:{image_seed}")
    monkeypatch.setenv("MPLCONFIGDIR", str(box))
    runners.seed_matplotlib_cache()
    assert {p.name: p.read_text() for p in box.iterdir()} == {"fontlist-v3.11.0.json": "runtime",
                                                              "fontlist-v330.json": "image 3.6"}
