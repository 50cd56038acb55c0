"""The agent's own argv parser (argparse is not imported on the box start-up path)."""

from __future__ import annotations

import pytest

from execbox.agent import main as agent_main


def test_both_forms_and_defaults():
    opts = agent_main.parse_args(["--workspace", "/workspace", "--limits={\"nofile\": 8}"])
    assert opts == {"--workspace": "/workspace", "--limits": "{\"nofile\": 8}", "--preload": "auto", "--run-as": ""}


def test_pid_ns_is_a_flag():
    opts = agent_main.parse_args(["--workspace", "/w", "--pid-ns", "--run-as", "1000:1000"])
    assert opts["--pid-ns"] == "1" and opts["--run-as"] == "1000:1000"
    assert "--pid-ns" not in agent_main.parse_args(["--workspace", "/w"])
    with pytest.raises(SystemExit):
        agent_main.parse_args(["--workspace", "/w", "--pid-ns=yes"])


@pytest.mark.parametrize("argv, message", [
    (["--preload", "none"], "--workspace is required"),
    (["--workspace"], "--workspace needs a value"),
    (["--workspace", "/w", "--evil", "x"], "unknown argument '--evil'"),
    (["--workspace", "/w", "positional"], "unknown argument 'positional'"),
])
def test_bad_argv_exits_with_usage(argv, message):
    with pytest.raises(SystemExit) as e:
        agent_main.parse_args(argv)
    assert message in str(e.value.code) and "usage: execbox-agent" in str(e.value.code)


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        agent_main.parse_args(["--help"])
    assert e.value.code == 0
    assert "--run-as" in capsys.readouterr().err


def test_private_tmpdir_is_fresh_and_0700(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    a, b = agent_main._private_tmpdir(), agent_main._private_tmpdir()
    assert a != b and a.startswith(str(tmp_path))
    assert (tmp_path / a.rsplit("/", 1)[1]).stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("choice, names", [
    ("auto", ["numpy", "pandas", "matplotlib.pyplot"]),
    ("none", []),
    ("", []),
    ("torch", ["torch"]),
    ("auto,torch", ["numpy", "pandas", "matplotlib.pyplot", "torch"]),
    ("torch, auto", ["torch", "numpy", "pandas", "matplotlib.pyplot"]),
    ("numpy,,none", ["numpy"]),
])
def test_preload_auto_can_be_one_entry_of_a_list(choice, names):
    assert agent_main.preload_names(choice) == names
