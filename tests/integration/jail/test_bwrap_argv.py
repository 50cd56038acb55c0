"""The bwrap command line: every isolation flag present, nothing of the host's mounted."""

from __future__ import annotations

from execbox.boxes import bwrap, runtime


def _argv(**kw):
    spec = bwrap.BoxSpec(runtime=runtime.Runtime("system", "/usr/bin/python3"), agent_root="/j/agent/abc",
                         etc_dir="/j/box-etc", env=bwrap.box_env(), agent_limits={"nofile": 1024},
                         seccomp_fd=7, **kw)
    return bwrap.build_argv(spec, "/usr/bin/bwrap")


def test_isolation_flags_and_seccomp_fd_are_present():
    argv = _argv(workspace_host="/j/boxes/b1/workspace")
    for flag in ("--unshare-all", "--unshare-user", "--unshare-cgroup", "--disable-userns", "--die-with-parent",
                 "--new-session", "--clearenv", "--as-pid-1"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--seccomp") + 1] == "7"
    assert argv[argv.index("--uid") + 1] == "1000"
    assert "--share-net" not in argv
    i = argv.index("--remount-ro")
    assert argv[i + 1] == "/" and i < argv.index("--")


def test_only_allowed_host_paths_are_mounted():
    argv = _argv(workspace_host="/j/boxes/b1/workspace")
    sources = {argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--ro-bind-try")}
    assert "/usr" in sources and "/j/boxes/b1/workspace" in sources
    for forbidden in ("/", "/etc", "/root", "/home", "/var", "/etc/shadow", "/proc", "/sys"):
        assert forbidden not in sources
    assert all(s.startswith(("/usr", "/etc/", "/j/", "/lib", "/bin", "/sbin")) for s in sources), sources
    writable = [argv[i + 2] for i, a in enumerate(argv) if a == "--bind"]
    assert writable == ["/workspace"]


def test_tmpfs_workspace_when_no_host_dir_and_sizes_are_set():
    argv = _argv(ws_size=1 << 20, tmp_size=1 << 19)
    assert "--bind" not in argv
    tmpfs = [(argv[i - 1], argv[i + 1]) for i, a in enumerate(argv) if a == "--tmpfs"]
    assert (str(1 << 19), "/tmp") in tmpfs and (str(1 << 20), "/workspace") in tmpfs


def test_environment_is_only_what_box_env_sets():
    argv = _argv()
    env = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    assert env == bwrap.box_env()
    assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["/usr/bin/python3", "-I"]


def test_a_capped_devpts_is_bound_over_bwraps_own_with_its_devices():
    """boxes/devpts.py: the service's instance replaces the one ``--dev`` mounts (so it comes
    after it), bound with --dev-bind (a plain --bind is nodev: no pty could be opened)."""
    argv = _argv(pts_host="/j/boxes/b1/pts")
    i = argv.index("/j/boxes/b1/pts") - 1
    assert argv[i:i + 3] == ["--dev-bind", "/j/boxes/b1/pts", "/dev/pts"] and argv.index("--dev") < i
    assert "/dev/pts" not in _argv()  # not root: bwrap's own instance
