"""Tokens given with --token sit in argv, readable by every local user (ps): the help of each CLI
that takes one recommends its environment variable instead."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from execbox.cli import app


@pytest.mark.parametrize("argv, var", [(["session", "pause", "--help"], "EXECBOX_TOKEN"),
                                       (["session", "rm", "--help"], "EXECBOX_TOKEN"),
                                       (["executor", "--help"], "EXECBOX_EXECUTOR_TOKEN")])
def test_token_help_recommends_the_environment_variable(argv, var):
    r = CliRunner().invoke(app, argv, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.replace("│", " ").split())
    assert f"Prefer the {var} environment variable" in text and "process list" in text
