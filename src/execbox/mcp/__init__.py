"""execbox as a Model Context Protocol server: tools, resources and session mapping.

A facade over the service core (sessions, runs, files): the same code path as the HTTP API, so
auth, quotas, audit and metrics apply to every tool call. ``execbox mcp`` serves it over stdio;
``execbox serve`` mounts streamable HTTP at ``/mcp``.
"""

from .server import build_server

__all__ = ["build_server"]
