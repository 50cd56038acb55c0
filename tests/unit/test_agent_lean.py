"""The agent's lean JSON/base64/signal (agent/lean.py) must behave as the stdlib wrappers do,
and the agent must start without the modules they would have pulled in."""

from __future__ import annotations

import base64
import binascii
import gc
import json
import math
import signal
import subprocess
import sys
import weakref

import pytest

from execbox.agent import lean
from execbox.boxes import staging

VALUES = [
    {}, [], "", "plain", "é ü 中文 🎉", "quote \" back \\ slash / nl \n tab \t nul \x00 \x1f",
    0, -1, 2**70, 1.5, -0.0, 1e300, 3.141592653589793, True, False, None,
    {"id": 7, "op": "exec", "code": "print('hi')\n", "env": {"A": "b"}, "nested": [[1, [2, {"x": None}]]]},
    {"1": 1, "b": [True, False, None], "unicode-ключ": "значение"},
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_dumps_matches_json_compact(value, ascii_only):
    assert lean.dumps(value, ensure_ascii=ascii_only) == json.dumps(value, separators=(",", ":"),
                                                                    ensure_ascii=ascii_only)


@pytest.mark.parametrize("value", VALUES)
def test_loads_and_raw_decode_round_trip(value):
    text = json.dumps(value)
    assert lean.loads(text) == value
    assert lean.loads(text.encode("utf-8")) == value
    assert lean.loads(bytearray(f"  {text}\n".encode())) == value
    assert lean.loads(f"\r\n\t {text} \t\r\n") == value
    doubled = text + json.dumps([value])
    first, end = lean.raw_decode(doubled, 0)
    assert first == value and lean.raw_decode(doubled, end)[0] == [value]


def test_bytes_decode_as_json_loads_decodes_them():
    raw = b'{"s": "\xed\xa0\x80 lone surrogate, \xc3\xa9"}'  # what json.loads accepts (surrogatepass)
    assert lean.loads(raw) == json.loads(raw)
    with pytest.raises(UnicodeDecodeError):
        lean.loads(b'"\xff"')


def test_non_finite_floats_as_json_does():
    assert lean.dumps([math.inf, -math.inf]) == "[Infinity,-Infinity]"
    assert math.isnan(lean.loads("NaN")) and lean.loads("-Infinity") == -math.inf
    with pytest.raises(ValueError):
        lean.dumps({"x": math.nan}, allow_nan=False)


def test_unserializable_and_circular_values_raise_what_json_raises_and_leave_no_state():
    with pytest.raises(TypeError, match="not JSON serializable"):
        lean.dumps({"x": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="[Cc]ircular"):
        lean.dumps(loop)
    # A failed encode must not keep what it was given (the C encoder's circular-check markers).
    class Unserializable:
        pass

    victim = Unserializable()
    ref = weakref.ref(victim)
    with pytest.raises(TypeError):
        lean.dumps([[1, {"a": [victim]}]])
    del victim
    gc.collect()
    assert ref() is None
    assert lean.dumps([[1, {"a": [2]}]]) == '[[1,{"a":[2]}]]'


@pytest.mark.parametrize("bad", ["", "{", '{"a":1}x', "[1,]", "nul", '"\x01"', '{"a" 1}', "1 2"])
def test_malformed_json_raises_json_decode_error(bad):
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)
    with pytest.raises(json.JSONDecodeError):
        lean.loads(bad)


@pytest.mark.parametrize("data", [b"", b"a", b"ab", b"abc", bytes(range(256)) * 3])
def test_base64_matches(data):
    enc = lean.b64encode(data)
    assert enc == base64.b64encode(data)
    assert lean.b64decode(enc) == data and lean.b64decode(enc.decode()) == data


@pytest.mark.parametrize("bad", ["a b=", "YWJj\n", "YW*j", "YQ", "YQ===", "é"])
def test_bad_base64_is_refused_as_with_validate(bad):
    with pytest.raises(ValueError):
        base64.b64decode(bad, validate=True)
    with pytest.raises((binascii.Error, ValueError)):
        lean.b64decode(bad)


def test_signal_numbers_and_functions_are_the_stdlib_ones():
    for name in ("SIGKILL", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIG_DFL", "SIG_IGN", "SIG_BLOCK"):
        assert getattr(lean.signal, name) == getattr(signal, name)
    assert lean.signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGINT)


def test_the_agents_own_imports_leave_out_re_enum_and_json():
    """What the lean modules are for: importing the agent pulls in none of these (a box that
    serves many runs imports USER_IMPORTS for its runs' sake; a one-shot's box does not)."""
    root = staging.staged_agent()
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import execbox_agent.main as m;"
             "print(sorted(n for n in ('re', 'enum', 'json', 'base64', 'signal', 'linecache', 'tokenize',"
             " 'typing', 'ast', 'ctypes', 'selectors', 'collections', 'shutil') if n in sys.modules));"
             " print(all(n in m.USER_IMPORTS for n in ('re', 'json', 'linecache')))")
    out = subprocess.run([sys.executable, "-I", "-c", probe, root], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


@pytest.mark.parametrize("linecache_first", [False, True])
def test_a_traceback_user_code_prints_itself_shows_its_source_line(linecache_first):
    """Runs forked from a lean agent have no linecache until something imports it; the source of
    ``<code>`` must still reach a traceback that user code prints (runners.show_source)."""
    code = ("def f():\n    raise ValueError('boom')\n"
            "try:\n    f()\nexcept ValueError:\n    import traceback; traceback.print_exc()\n")
    probe = ("import sys; sys.path.insert(0, sys.argv[1])\n"
             + ("import linecache\n" if linecache_first else "")
             + "from execbox_agent import runners\n"
             "runners.show_source(sys.argv[2]); runners.show_source(sys.argv[2])  # a context's second run\n"
             "print('linecache' in sys.modules)\n"
             "exec(compile(sys.argv[2], runners.CODE_FILENAME, 'exec'), {})\n"
             "print(sum(type(f).__name__ == '_SeedOnImport' for f in sys.meta_path))\n")
    out = subprocess.run([sys.executable, "-I", "-c", probe, staging.staged_agent(), code],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(linecache_first), "0"]  # the finder left once it had seeded
    assert 'File "<code>", line 2, in f' in out.stderr
    assert "raise ValueError('boom')" in out.stderr and "    f()" in out.stderr


def test_libc_calls_prctl_and_reports_errno_as_ctypes_does():
    """lean.libc() (from _ctypes) answers as ctypes.CDLL does: a value, and errno on failure."""
    import ctypes
    import errno

    dll = ctypes.CDLL(None, use_errno=True)
    pr_get_dumpable, bad_option = 3, 0x7FFF
    assert lean.libc().prctl(pr_get_dumpable, 0, 0, 0, 0) == dll.prctl(pr_get_dumpable, 0, 0, 0, 0) == 1
    assert lean.libc().prctl(bad_option, 0, 0, 0, 0) == -1
    assert lean.libc().get_errno() == errno.EINVAL
    assert lean.libc().prctl is lean.libc().prctl  # looked up once
    with pytest.raises(AttributeError):
        getattr(lean.libc(), "no_such_function_in_libc")  # noqa: B009 - the lookup is the test


def test_remove_tree_removes_everything_below_and_follows_no_symlink(tmp_path):
    """The agent's temp dir goes at exit without shutil; a link in it to elsewhere is unlinked,
    what it points to stays."""
    from execbox.agent import fileops

    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("x")
    top = tmp_path / "agent-tmp"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("y")
    (top / "g").write_text("z")
    (top / "a" / "to-dir").symlink_to(outside / "keep")
    (top / "to-file").symlink_to(outside / "keep" / "file")
    fileops.remove_tree(str(top))
    assert not top.exists()
    assert (outside / "keep" / "file").read_text() == "x"
    fileops.remove_tree(str(top))  # already gone: no error
