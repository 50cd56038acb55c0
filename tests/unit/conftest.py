"""Fixtures shared by unit tests in different modules."""

from .client_fakes import serve  # noqa: F401 - a fixture: raw hostile HTTP servers (test_client_*)
