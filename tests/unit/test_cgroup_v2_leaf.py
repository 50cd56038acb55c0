"""cgroup v2 set-up (boxes/cgroups._prepare_v2) when execbox starts inside its own service leaf.

A shell that ran `execbox run` once sits in ``<group>/execbox-service`` afterwards (v2 moves every
process of a group that hands controllers down). On a 16-core v2 host, fifteen starts from one
shell had nested the leaf fifteen deep, each start moving the shell once more and making a box
parent of its own (docs/device-runs/2026-11-27). A plain file tree stands in for the cgroup
filesystem here: the decision is which group becomes the base, not what the kernel does with it.
"""

from __future__ import annotations

import os

from execbox.boxes import cgroups

CONTROLLERS = "cpuset cpu io memory pids\n"


def _group(path: str, subtree: str = "") -> str:
    os.makedirs(path, exist_ok=True)
    for name, text in (("cgroup.controllers", CONTROLLERS), ("cgroup.subtree_control", subtree),
                       ("cgroup.procs", ""), ("cpu.weight", "100")):
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return path


def test_a_start_inside_the_leaf_shares_the_earlier_parent(tmp_path):
    mount = str(tmp_path)
    _group(os.path.join(mount, "user.slice"), "cpu memory pids")  # an earlier start made it ready
    leaf = _group(os.path.join(mount, "user.slice", "execbox-service"))
    _group(os.path.join(mount, "user.slice", "execbox"), "cpu memory pids")

    parent = cgroups._prepare_v2(mount, "/user.slice/execbox-service")

    assert parent == os.path.join(mount, "user.slice", "execbox")
    assert sorted(os.listdir(leaf)) == ["cgroup.controllers", "cgroup.procs", "cgroup.subtree_control",
                                        "cpu.weight"]  # no leaf, no box parent inside the leaf
    assert open(os.path.join(leaf, "cgroup.subtree_control")).read() == ""


def test_a_group_named_like_the_leaf_whose_parent_hands_nothing_down_is_used_as_it_is(tmp_path):
    mount = str(tmp_path)
    _group(os.path.join(mount, "app"))  # not made ready by execbox: nothing enabled for children
    own = _group(os.path.join(mount, "app", "execbox-service"))
    _group(os.path.join(own, "execbox"))

    parent = cgroups._prepare_v2(mount, "/app/execbox-service")

    assert parent == os.path.join(own, "execbox")
    assert "memory" in open(os.path.join(own, "cgroup.subtree_control")).read()
