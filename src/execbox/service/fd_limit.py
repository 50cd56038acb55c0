"""The service's open-file limit, raised to what the host allows before any box starts.

Each live jail box holds five of the service's descriptors (the agent's pipes, its stderr tail,
the OOM counter it reads on every run) and Docker boxes hold their sockets. A systemd service or a
login shell starts with a soft RLIMIT_NOFILE of 1024, which would cap one service at ~200 live
sessions and fail the next box start with EMFILE; the hard limit is usually 524288. Raising the
soft limit up to the hard one needs no privilege. Boxes do not inherit it where it matters: the
agent sets each run's own nofile (docs/jail.md).
"""

from __future__ import annotations

import resource

CEILING = 1 << 20
"""Never ask for more than this, even where the hard limit is unlimited."""


def raise_open_file_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (at most CEILING); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft
