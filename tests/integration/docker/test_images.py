"""Registry-free worker images: cache hits, the CLI, bad input."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from execbox.boxes import images
from execbox.cli import app
from execbox.errors import InvalidConfigError

pytestmark = pytest.mark.docker


def test_second_build_with_same_inputs_is_a_cache_hit(docker_engine):
    spec = images.image_for("python")
    name, built = images.build_image(docker_engine, spec)
    assert (name, built) == ("execbox/python:latest", False)
    labels = docker_engine.images.get(name).attrs["Config"]["Labels"]
    assert labels[images.HASH_LABEL] == spec.input_hash
    cfg = docker_engine.images.get(name).attrs["Config"]
    assert cfg["User"] == "1000:1000" and cfg["WorkingDir"] == "/workspace"


def test_input_hash_follows_inputs():
    a = images.image_for("python", "http://deb.debian.org/debian")
    b = images.image_for("python", "http://mirror.example/debian")
    assert a.input_hash != b.input_hash
    assert a.input_hash == images.image_for("python", "http://deb.debian.org/debian").input_hash
    assert images.image_for("node").packages == ("python3", "nodejs")


def test_image_has_no_compiler(provider, instance):
    r = provider.execute_code(instance, "command -v gcc cc g++ || echo none", "bash")
    assert r.stdout.strip() == "none"
    r = provider.execute_code(instance, "import numpy, pandas, scipy; print(numpy.arange(3).sum())", "python")
    assert r.stdout == "3\n", r.stderr


def test_a_box_starts_from_the_image_s_font_cache_instead_of_scanning_fonts(provider, instance):
    """The image carries matplotlib's font list; each box's agent copies it into its empty /tmp
    (MPLCONFIGDIR), owned by the sandbox user, and matplotlib uses it as it is (no rebuild)."""
    code = ("import os\n"
            "seed = '/opt/execbox/mpl-seed/fontlist-v330.json'\n"
            "box = '/tmp/fontlist-v330.json'\n"
            "before = os.stat(box).st_mtime_ns\n"
            "import matplotlib.font_manager\n"
            "same = open(seed, 'rb').read() == open(box, 'rb').read()\n"
            "print(os.stat(box).st_uid == os.getuid(), os.stat(box).st_mtime_ns == before, same)")
    r = provider.execute_code(instance, code, "python", 60)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "True True True\n", ""), r.stderr[-500:]


def test_cli_build_reports_cache_hit(docker_engine):
    result = CliRunner().invoke(app, ["image", "build", "python"])
    assert result.exit_code == 0, result.output
    assert "execbox/python:latest cached" in result.output


def test_unknown_flavor_is_sb002():
    with pytest.raises(InvalidConfigError):
        images.image_for("ruby")
    result = CliRunner().invoke(app, ["image", "build", "ruby"])
    assert result.exit_code == 2 and "SB002" in result.output
