"""Internals of the public SDK (``execbox.Sandbox``, ``RemoteSandbox`` and their async twins).

The package root (``execbox``) is the public interface; what lives here is shared machinery:
the ``commands`` namespace and background command handles.
"""
