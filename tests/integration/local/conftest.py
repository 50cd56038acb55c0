"""A local-provider sandbox for a test module (the same agent runs in every self-hosted box)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from execbox import Sandbox


@contextlib.contextmanager
def local_box(max_memory: str) -> Iterator[Sandbox]:
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_memory": max_memory})
    try:
        with Sandbox.create(p) as s:
            yield s
    finally:
        p.shutdown()
