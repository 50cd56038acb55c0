"""Which modules a box's agent preloads, given its runtime and memory.

Shared by the providers whose boxes may run under gVisor (docker, kubernetes).
"""

from __future__ import annotations

from ..boxes.oci_seccomp import is_gvisor

GVISOR_AUTO_PRELOAD_MIN = 512 * 1024 * 1024
"""Bytes of box memory below which ``preload: auto`` preloads nothing under gVisor."""


def effective_preload(choice: str, runtime: str, memory: int) -> tuple[str, str | None]:
    """The ``preload`` a box is started with, and a note for the operator when it differs.

    gVisor charges the preloaded agent's whole heap to the box: at 256m a preload-auto box keeps
    about 5 MiB free at rest, so the fork of a run, a context or a pty can end the box with an OOM.
    Under gVisor below ``GVISOR_AUTO_PRELOAD_MIN`` the ``auto`` part is therefore dropped; modules
    the operator listed by name are kept (that is an explicit choice of memory for speed).
    """
    names = [n.strip() for n in (choice or "auto").split(",") if n.strip()]
    if "auto" not in names or not is_gvisor(runtime) or memory >= GVISOR_AUTO_PRELOAD_MIN:
        return choice or "auto", None
    kept = ",".join(n for n in names if n != "auto") or "none"
    return kept, (f"preload 'auto' is off under {runtime} with less than 512 MiB of memory (gVisor counts the "
                  f"preloaded agent's heap against the box's memory); boxes preload {kept!r}. Give "
                  "boxes 512 MiB, or list modules by name to preload them anyway")
