"""/home/user in a box is the workspace (bwrap.HOME_ALIAS): E2B programs write there, and E2B's
SDK names files there, so code and the file API see the same files either way."""

from __future__ import annotations

from .conftest import run


def test_home_user_is_the_workspace_for_code_and_files(jail, box):
    jail.write_file(box, "p.txt", "hi")
    r = run(jail, box, "cat /home/user/p.txt; echo; cd /home/user && pwd -P && echo made > /home/user/q.txt", "bash")
    assert (r.exit_code, r.stdout) == (0, "hi\n/workspace\n"), r
    assert jail.read_file(box, "q.txt").content == "made\n"
    r = run(jail, box, "print(open('/home/user/p.txt').read())")
    assert r.stdout == "hi\n", r


def test_the_rest_of_home_stays_read_only(jail, box):
    r = run(jail, box, "ls -A /home; touch /home/other", "bash")
    assert r.stdout == "user\n" and r.exit_code != 0 and "Read-only file system" in r.stderr, r
