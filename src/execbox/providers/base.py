"""The provider contract every backend implements (the seed's methods and signatures, plus
the session operations the gateway needs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from ..errors import InvalidConfigError, ProviderNotInitializedError
from ..models import (
    ExecutionResult,
    FileInfo,
    GrepMatch,
    Isolation,
    Language,
    SandboxInstance,
    TextPage,
)

OutputCallback = Callable[[str, str], None]
"""Called with ("stdout" | "stderr", text) as output arrives, when a caller streams."""

SCHEMA_KEYS = frozenset(
    {"type", "required", "secret", "label", "description", "placeholder", "default", "options", "min", "max",
     "secret_destination"}
)
"""``secret_destination: true`` marks a field that decides where the provider's ``secret`` fields are
sent (an endpoint, API URL or domain): when its value changes, a stored secret is not reused, so the
admin API refuses a redacted (or omitted) secret and the secret must be sent again."""
SCHEMA_TYPES = frozenset({"string", "integer", "number", "boolean", "json", "list"})


def check_code_and_arguments(code: Any, arguments: Any) -> None:
    """SB002 unless ``code`` is a string and ``arguments`` a JSON object or None."""
    if not isinstance(code, str):
        raise InvalidConfigError("code must be a string", details={"field": "code"})
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidConfigError("arguments must be a JSON object (dict)", details={"field": "arguments"})


def check_timeout(timeout: Any) -> float:
    """SB002 unless ``timeout`` is a positive number of seconds (a bool is not a number here)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise InvalidConfigError("timeout must be a positive number of seconds",
                                 details={"field": "timeout", "value": str(timeout)})
    return float(timeout)


def check_run_inputs(code: Any, arguments: Any, timeout: Any) -> None:
    """The input checks every provider makes before anything is sent to a box or a cloud."""
    check_code_and_arguments(code, arguments)
    check_timeout(timeout)


class SandboxProvider(ABC):
    """Base interface for all sandbox providers."""

    name: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    tags: ClassVar[list[str]] = []
    isolation: ClassVar[Isolation] = Isolation.NONE
    zero_config: ClassVar[bool] = False
    """True for self-hosted providers that work with no configuration (zero-config candidates)."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.initialized = False
        self.selection_note: str | None = None  # why zero-config picked this provider over stronger ones

    # -- the seed's contract ----------------------------------------------------------------
    @abstractmethod
    def initialize(self, config: dict[str, Any]) -> bool:
        """Initialize provider with configuration."""

    @abstractmethod
    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None) -> SandboxInstance:
        """Create a new sandbox instance."""

    @abstractmethod
    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None,
                     inline_artifacts: bool = False) -> ExecutionResult:
        """Execute code in the sandbox.

        Python: ``main(**arguments)`` if arguments are given, else ``main()`` when defined.
        JavaScript: ``main(arguments)`` likewise. The value travels in ``result``.
        ``inline_artifacts`` attaches artifact bytes to the result (one-shot runs, where the
        instance is destroyed before anyone could fetch them).
        """

    def check_code_policy(self, code: str, language: Language) -> None:
        """The provider's code policy (``enable_ast_analysis``, where it has one) on ``code``:
        raises its SB error. ``execute_code`` applies it; a caller that wraps the user's code in
        a program of its own (the E2B cell driver) calls it so the policy judges what the user wrote."""
        policy = getattr(self, "_policy", None)
        if language is Language.PYTHON and policy is not None:
            policy.check(code)

    @abstractmethod
    def destroy_instance(self, instance_id: str) -> bool:
        """Destroy a sandbox instance and everything it started."""

    @abstractmethod
    def health_check(self) -> bool:
        """Check if provider is healthy."""

    @abstractmethod
    def get_supported_languages(self) -> list[str]:
        """Languages this provider runs."""

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        """Field name -> {type, required, secret, label, description, placeholder, default,
        options, min, max, secret_destination}."""
        return {}

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        """Provider-specific checks beyond the schema."""
        return True, None

    # -- session operations -----------------------------------------------------------------
    def run_command(self, instance_id: str, command: str, timeout: int = 30, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        raise self._unsupported("run_command")

    def read_file(self, instance_id: str, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        raise self._unsupported("read_file")

    def read_bytes(self, instance_id: str, path: str, offset: int | None = None, length: int | None = None) -> bytes:
        """A file's bytes (at most 64 MiB), or ``length`` bytes from ``offset``; a ``FileBytes``
        that knows the file's ``total_size`` where the provider can tell it."""
        raise self._unsupported("read_bytes")

    def write_file(self, instance_id: str, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        raise self._unsupported("write_file")

    def write_files(self, instance_id: str, files: dict[str, str | bytes]) -> list[FileInfo]:
        """Write several files atomically: all or none."""
        raise self._unsupported("write_files")

    def list_files(self, instance_id: str, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        raise self._unsupported("list_files")

    def glob(self, instance_id: str, pattern: str, max_results: int = 1000) -> list[str]:
        """Matching paths; a ``GlobResult`` (``truncated``) where the provider can tell."""
        raise self._unsupported("glob")

    def grep(self, instance_id: str, pattern: str, path: str = ".", glob: str | None = None,
             max_results: int = 100) -> list[GrepMatch]:
        """Matching lines; a ``GrepResult`` (``truncated``, ``binary_matches``, ``skipped``) where
        the provider can tell."""
        raise self._unsupported("grep")

    def cancel(self, instance_id: str) -> bool:
        """Stop the execution running in an instance, if any (client went away)."""
        return False

    def shutdown(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release everything the provider holds (pools, instances)."""

    # -- host facts -------------------------------------------------------------------------
    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(usable on this host, reason) for doctor and zero-config selection."""
        return True, "ok"

    # -- helpers ----------------------------------------------------------------------------
    def _unsupported(self, op: str) -> InvalidConfigError:
        return InvalidConfigError(
            f"provider {self.name!r} does not support {op}", details={"provider": self.name, "operation": op},
            http_status=501,
        )

    def _require_initialized(self) -> None:
        if not self.initialized:
            raise ProviderNotInitializedError(
                f"provider {self.name!r} is not initialized; call initialize(config) first",
                details={"provider": self.name},
            )

    @classmethod
    def schema_defaults(cls) -> dict[str, Any]:
        return {k: v.get("default") for k, v in cls.get_config_schema().items() if "default" in v}
