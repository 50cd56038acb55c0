"""In-process SDK: ``get_sandbox``, ``execute_code`` and the ``Sandbox`` session (exported by ``execbox``)."""

from __future__ import annotations

import atexit
import inspect
import os
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidConfigError, NotTextError, SandboxClosedError
from ..models import ExecutionResult, FileInfo, GrepMatch, TextPage
from ..providers.agent_files import workspace_change
from ..providers.base import OutputCallback, SandboxProvider
from ..providers.registry import create_provider, get_provider_class, strongest_available
from ..settings import sandbox_timeout, sandbox_type
from .commands import Commands, RunFn, StopFn
from .file_results import read_bytes_hint

_default: dict[tuple[str, str], SandboxProvider] = {}
_default_lock = threading.Lock()


def get_sandbox(provider: str | None = None, config: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> SandboxProvider:
    """An initialized provider chosen by ``provider``, else SANDBOX_TYPE (alias SANDBOX_BACKEND),
    else the zero-config provider (the jail; SB009 naming why where it cannot run here).

    SANDBOX_TIMEOUT_SEC ("60", "60s", "1m") sets the default timeout; a bad value is SB002.
    """
    timeout = sandbox_timeout(env)  # parse first: a bad value fails before anything starts
    name = (provider or sandbox_type(env) or "").lower() or None
    note = None
    if name is None:
        name, skipped = strongest_available()
        if skipped:
            note = "; ".join(f"{n} unavailable: {r}" for n, r in skipped.items())
    cls = get_provider_class(name)
    cfg = dict(config or {})
    schema = cls.get_config_schema()
    env_map = os.environ if env is None else env
    if "timeout" in schema and "timeout" not in cfg and env_map.get("SANDBOX_TIMEOUT_SEC", "").strip():
        cfg["timeout"] = max(1, int(round(timeout)))
    prov = create_provider(name, cfg)
    prov.selection_note = note
    return prov


def default_provider() -> SandboxProvider:
    """Process-wide provider for one-shot calls, created on first use from the environment and
    shut down when the process exits (its warm pool's boxes with it)."""
    key = (sandbox_type() or "", os.environ.get("SANDBOX_TIMEOUT_SEC", ""))
    with _default_lock:
        prov = _default.get(key)
        if prov is None or not prov.initialized:
            if not _default:
                atexit.register(_shut_defaults)
            prov = get_sandbox()
            _default[key] = prov
        return prov


def _shut_defaults() -> None:
    """At exit: a pool's spare boxes are processes, mounts and cgroups of this process's; left
    running, the next execbox process finds them dead and reaps them (``execbox run`` left two
    on every call)."""
    with _default_lock:
        provs = list(_default.values())
        _default.clear()
    for prov in provs:
        try:
            prov.shutdown()
        except Exception:  # noqa: BLE001, S110 - exiting: nothing else can be done with it
            pass


def _resolve_provider(provider: str | SandboxProvider | None, config: Mapping[str, Any] | None
                      ) -> tuple[SandboxProvider, bool]:
    if isinstance(provider, SandboxProvider):
        if config:
            raise InvalidConfigError("pass config only with a provider name, not a provider object")
        return provider, False
    if provider is None and not config:
        return default_provider(), False
    return get_sandbox(provider, config), True


def _default_timeout(provider: SandboxProvider) -> float:
    t = provider.config.get("timeout")
    return float(t) if t else sandbox_timeout()


def execute_code(code: str, language: str = "python", timeout: float | None = 30,
                 arguments: dict[str, Any] | None = None, *, provider: str | SandboxProvider | None = None,
                 config: Mapping[str, Any] | None = None, tenant_id: str = "default",
                 url: str | None = None, token: str | None = None) -> ExecutionResult:
    """Run code once: create an instance, execute, and always destroy it.

    With ``url`` (and ``token``) the call goes to a remote execbox service instead.
    Artifacts come back with their bytes attached (the instance is gone afterwards).
    """
    if url is not None:
        from .remote import RemoteSandbox  # imported late: httpx only when a URL is given

        return RemoteSandbox.execute_once(url, token, code, language, timeout, arguments, tenant_id=tenant_id)
    prov, owned = _resolve_provider(provider, config)
    try:
        inst = prov.create_instance(template=language, tenant_id=tenant_id)
        try:
            result = prov.execute_code(inst.instance_id, code, language,
                                       timeout if timeout is not None else _default_timeout(prov), arguments,
                                       inline_artifacts=True)
        finally:
            prov.destroy_instance(inst.instance_id)
        for a in result.artifacts:
            a._fetcher = None
        return result
    finally:
        if owned:
            prov.shutdown()


class Files:
    """Workspace file operations of one Sandbox (paths are relative to the workspace)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        """Lines ``offset`` .. ``offset+limit`` of a text file of any size; a binary file is a
        ``NotTextError`` (read it with ``read_bytes``)."""
        try:
            return self._sb.provider.read_file(self._sb.instance_id, path, offset, limit)
        except NotTextError as e:
            raise read_bytes_hint(e, path) from None

    def read_bytes(self, path: str, offset: int | None = None, length: int | None = None) -> bytes:
        """A file's bytes (at most 64 MiB, else 413), or ``length`` bytes (at most 64 MiB) from
        ``offset``: a ``FileBytes`` whose ``total_size`` is the file's size, to fetch a larger one in pieces."""
        return self._sb.provider.read_bytes(self._sb.instance_id, path, offset=offset, length=length)

    def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        return self._sb.provider.write_file(self._sb.instance_id, path, content, mode)

    def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        return self._sb.provider.write_files(self._sb.instance_id, files)

    def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        return self._sb.provider.list_files(self._sb.instance_id, path, recursive)

    def glob(self, pattern: str, max_results: int = 1000) -> list[str]:
        """Matching paths, at most ``max_results``: a ``GlobResult`` (``truncated`` when more matched)."""
        return self._sb.provider.glob(self._sb.instance_id, pattern, max_results)

    def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
             ) -> list[GrepMatch]:
        """Matching lines, at most ``max_results``: a ``GrepResult`` (``truncated``, ``binary_matches``,
        ``skipped``)."""
        return self._sb.provider.grep(self._sb.instance_id, pattern, path, glob, max_results)

    def delete(self, path: str) -> None:
        """Remove a file, or a directory and what it holds (a symlink itself, never its target)."""
        delete = workspace_change(self._sb.provider, "delete_path", "delete workspace files")
        delete(self._sb.instance_id, path)

    def mkdir(self, path: str) -> bool:
        """Make a directory and its parents; False when it was one already."""
        mkdir = workspace_change(self._sb.provider, "make_dir", "make workspace directories")
        return bool(mkdir(self._sb.instance_id, path))

    def move(self, source: str, destination: str) -> str:
        """Rename or move within the workspace, as ``mv`` (a file at ``destination`` is replaced);
        where it is now."""
        move = workspace_change(self._sb.provider, "move_path", "move workspace files")
        return str(move(self._sb.instance_id, source, destination))


class Sandbox:
    """A session: one instance whose workspace and contexts persist until ``close()``.

    >>> with Sandbox.create(provider="local") as sb:
    ...     sb.files.write("data.txt", "hello")
    ...     sb.run_code("print(open('data.txt').read())").stdout
    'hello\\n'

    ``sb.commands.run(cmd)`` runs a shell command; ``background=True`` returns a CommandHandle
    (``stdout``/``stderr`` so far, ``wait()``, ``kill()``, ``exit_code``).
    """

    def __init__(self, provider: SandboxProvider, instance_id: str, owns_provider: bool = False,
                 metadata: dict[str, Any] | None = None) -> None:
        self.provider = provider
        self.instance_id = instance_id
        self.metadata = metadata or {}
        self._owns_provider = owns_provider
        self.closed = False
        self.files = Files(self)
        self.commands = Commands(self)

    @classmethod
    def create(cls, provider: str | SandboxProvider | None = None, *, config: Mapping[str, Any] | None = None,
               tenant_id: str = "default", session_id: str | None = None, template: str = "python",
               runtime: str | None = None) -> Sandbox:
        """``runtime``: a runtime template (``NAME`` or ``NAME@vN``, `execbox runtime build`) for this
        sandbox only; providers without templates refuse it with SB002."""
        prov, owned = _resolve_provider(provider, config)
        try:
            extra = {"runtime": runtime} if runtime else {}
            if runtime and "runtime" not in inspect.signature(prov.create_instance).parameters:
                raise InvalidConfigError(f"provider {prov.name!r} does not support runtime templates "
                                         f"(runtime={runtime!r})", details={"field": "runtime"})
            inst = prov.create_instance(template=template, tenant_id=tenant_id, session_id=session_id, **extra)
        except BaseException:
            if owned:
                prov.shutdown()
            raise
        return cls(prov, inst.instance_id, owned, inst.metadata)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxClosedError("this Sandbox is closed: close() destroyed its box; create a new Sandbox to "
                                     "run more", details={"instance_id": self.instance_id, "reason": "closed"})

    def run_code(self, code: str, language: str = "python", *, timeout: float | None = None,
                 arguments: dict[str, Any] | None = None, context_id: str | None = None,
                 on_output: OutputCallback | None = None) -> ExecutionResult:
        self._check_open()
        kwargs: dict[str, Any] = {}
        if context_id is not None:
            kwargs["context_id"] = context_id
        if on_output is not None:
            kwargs["on_output"] = on_output
        return self.provider.execute_code(self.instance_id, code, language,
                                          timeout if timeout is not None else _default_timeout(self.provider),
                                          arguments, **kwargs)

    def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        self._check_open()
        return self.provider.run_command(self.instance_id, command,
                                         timeout if timeout is not None else _default_timeout(self.provider),
                                         cwd=cwd, env=env, on_output=on_output)

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[RunFn, StopFn]:
        def run(out: OutputCallback) -> ExecutionResult:
            return self.run_command(command, timeout=timeout, cwd=cwd, env=env, on_output=out)

        def stop() -> None:  # the agent kills the run's process tree
            self.provider.cancel(self.instance_id)

        return run, stop

    def install(self, pip: list[str] | None = None, npm: list[str] | None = None, *,
                timeout: float | None = None) -> dict[str, Any]:
        """Install pip/npm packages into this sandbox's workspace through the egress gateway (the
        index hosts are allowed for this step only); importable/require-able by the next run."""
        self._check_open()
        do = getattr(self.provider, "install_packages", None)
        if do is None:
            raise InvalidConfigError(f"provider {self.provider.name!r} does not support in-session installs",
                                     details={"provider": self.provider.name})
        return do(self.instance_id, pip=pip, npm=npm, timeout=timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.provider.destroy_instance(self.instance_id)
        finally:
            if self._owns_provider:
                self.provider.shutdown()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
