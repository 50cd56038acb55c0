"""The in-box agent: the one place that knows how to run code and touch workspace files.

Stdlib only, no imports from the rest of execbox: boxes mount this directory read-only as the
top-level package ``execbox_agent`` and start ``execbox_agent.main``.
"""

SHIPPED_SUFFIXES = (".py", ".js", ".mjs")
"""The agent's files every box gets (staged, bundled for clouds, put in a pod's ConfigMap)."""
