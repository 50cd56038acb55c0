"""The in-box agent's output cap, applied again on the host to output from a remote party.

A remote ``/run`` executor (self_managed) or an agent that tenant code may have replaced (cloud
sandboxes) is not bound by our agent's cap, so the host keeps at most as much as a box of its own
would give: the head of each stream, ``truncated`` set when anything was cut.
"""

from __future__ import annotations

from ..agent.pump import DEFAULT_OUTPUT_CAP

OUTPUT_CAP = DEFAULT_OUTPUT_CAP
"""Bytes (UTF-8) kept of stdout and of stderr: the agent's default, as for every self-hosted provider."""


def cap_text(text: str, cap: int = OUTPUT_CAP) -> tuple[str, bool]:
    """``text`` cut to ``cap`` UTF-8 bytes (its head, as the agent keeps), and whether it was cut."""
    if len(text) * 4 <= cap:  # no character is more than 4 bytes: surely within the cap
        return text, False
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text, False
    return data[:cap].decode("utf-8", "ignore"), True
