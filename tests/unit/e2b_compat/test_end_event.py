"""A process ended by a signal reads as envd says it (Go's signal names), whatever the signal: a
command whose output relay died got `error='13'` (review 38)."""

from __future__ import annotations

import pytest

from execbox.service.e2b_compat.envd_bg import end_event


@pytest.mark.parametrize(("sig", "name"), [(9, "killed"), (15, "terminated"), (2, "interrupt"), (1, "hangup"),
                                            (13, "broken pipe"), (11, "segmentation fault")])
def test_a_signal_is_named_as_envd_names_it(sig: int, name: str) -> None:
    end = end_event({"signal": sig}, False, None).event.value
    assert (end.status, end.error, end.exited) == (f"signal: {name}", name, False)


def test_an_exit_and_a_timeout_are_unchanged() -> None:
    assert end_event({"exit_code": 3}, False, None).event.value.status == "exit status 3"
    assert end_event({"exit_code": 0}, True, None).event.value.status == "timeout"
