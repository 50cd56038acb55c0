"""On real jail boxes (the agent unprivileged in bubblewrap's user namespace): user code is the OOM
killer's first pick rather than the agent, and file names that are not valid UTF-8 do not break a
run's reply or the session's listings."""

from __future__ import annotations

import pytest

from tests.conftest import wait_process_exit

from .conftest import run

pytestmark = pytest.mark.jail

SCORES = ("import os\nown = open('/proc/self/oom_score_adj').read().strip()\n"
          "agent = open(f'/proc/{os.getppid()}/oom_score_adj').read().strip()\nprint(own, agent)")


def test_user_code_is_picked_before_the_agent(jail, box):
    for kw in ({}, {"context_id": "c1"}):
        r = run(jail, box, SCORES, **kw)
        own, agent = r.stdout.split()
        assert (own, r.exit_code) == ("1000", 0), r.stderr
        assert int(agent) < 1000, kw  # the run's parent, the agent, is left as it was
    pid = jail.start_process(box, "cat /proc/self/oom_score_adj")
    out, _, _ = wait_process_exit(jail, box, pid, timeout=10)
    assert out == b"1000\n"


def test_names_that_are_not_utf8_are_left_out_not_fatal(jail, box):
    r = run(jail, box, "import os\nos.makedirs('artifacts', exist_ok=True)\n"
                       "open(b'artifacts/\\xff\\xfe.bin', 'wb').write(b'x')\nopen('artifacts/ok.txt', 'w').write('y')\n"
                       "open(b'ws\\xff', 'wb').write(b'needle')\nprint('made')")
    assert (r.exit_code, r.stdout) == (0, "made\n"), r.stderr  # was SB009, the run's output lost
    assert [a.name for a in r.artifacts] == ["ok.txt"] and "not valid UTF-8" in r.stderr
    assert sorted(f.path for f in jail.list_files(box, ".", recursive=True)) == ["artifacts", "artifacts/ok.txt"]
    assert sorted(jail.glob(box, "**/*")) == ["artifacts", "artifacts/ok.txt"]
    assert jail.grep(box, "needle") == []
    assert run(jail, box, "print(6 * 7)").stdout == "42\n"


def test_a_context_that_dies_of_memory_reports_its_peak(jail, box):
    """A JavaScript context out of heap aborts: the run still says how much memory it had reached
    (the rusage that came with its exit status), where it helps most."""
    import shutil

    from tests.conftest import require

    require(shutil.which("node") is not None, "node (JavaScript contexts)")
    r = run(jail, box, "const a = []; while (true) a.push(new Array(1e6).fill(1))", language="javascript",
            context_id="heap", timeout=60)
    assert r.error_code == "SB006" and r.metadata.get("context_reset") is True, (r.metadata, r.stderr[-300:])
    assert r.metadata["peak_memory_kb"] > 100 * 1024, r.metadata
