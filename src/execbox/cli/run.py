"""``execbox run`` (a file or stdin) and ``execbox exec --json`` (one JSON request -> one JSON result)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from ..errors import InvalidConfigError, SandboxError
from ._exec_json import EXEC_FIELDS, handle_exec_request, internal_error, read_request

EXTENSIONS = {".py": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
              ".sh": "bash", ".bash": "bash"}
EXIT_TIMEOUT = 124
EXIT_ERROR = 2


def _fail(err: SandboxError, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"ok": False, **err.to_dict()}) + "\n")
    else:
        typer.echo(f"execbox: {err.code}: {err.message}", err=True)
        if err.details:
            typer.echo(f"details: {json.dumps(err.details, default=str)}", err=True)
    raise typer.Exit(EXIT_ERROR)


def _parse_args_json(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidConfigError(f"--args is not valid JSON: {e}", details={"field": "args"}) from None
    if not isinstance(value, dict):
        raise InvalidConfigError("--args must be a JSON object", details={"field": "args"})
    return value


def _program_text(raw: bytes, source: str) -> str:
    """The program as text: UTF-8 or SB002 naming where it came from (the size is already capped)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidConfigError(f"the program on {source} is not UTF-8 text (byte {e.start})",
                                 details={"field": "file"}) from None


def run(
    file: str = typer.Argument(..., help="Program file, or '-' to read the code from stdin."),
    language: str | None = typer.Option(None, "--language", "-l",
                                        help="python, javascript (nodejs, js) or bash; default from the extension."),
    args: str | None = typer.Option(None, "--args", help="JSON object passed to main() as arguments."),
    provider: str | None = typer.Option(
        None, "--provider", "-p",
        help="Provider name; default: the settings store's active provider when a store exists, else "
             "SANDBOX_TYPE, else the jail. A store's settings for the provider apply."),
    timeout: str | None = typer.Option(None, "--timeout", "-t", help="Timeout: '30', '30s', '1m'."),
    show_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON instead of the output."),
) -> None:
    """Run a program once in a fresh sandbox and print its output.

    The exit status is the program's (124 on timeout, 2 on an execbox error). The value main()
    returns is printed to stderr as `result: <json>` (stdout stays the program's own).
    """
    from ..sdk.local import execute_code
    from ..settings import parse_duration
    from ._stored import stored_provider

    try:
        if file == "-":
            code = _program_text(read_request(sys.stdin.buffer), "stdin")
            lang = language or "python"
        else:
            path = Path(file)
            if not path.is_file():
                raise InvalidConfigError(f"no such file: {file}", details={"field": "file"})
            with path.open("rb") as f:
                code = _program_text(read_request(f, source=file), file)
            lang = language or EXTENSIONS.get(path.suffix.lower())
            if lang is None:
                raise InvalidConfigError(
                    f"cannot tell the language of {file!r} from its extension; pass --language",
                    details={"field": "language"})
        seconds = parse_duration(timeout, "--timeout") if timeout is not None else None
        arguments = _parse_args_json(args)
        name, config, _ = stored_provider(provider, None)  # its endpoint, key and limits, as configured
        result = execute_code(code, lang, seconds, arguments, provider=name, config=config)
    except SandboxError as e:
        _fail(e, show_json)
        return
    if show_json:
        sys.stdout.write(json.dumps(result.to_dict(include_artifact_content=False), default=str) + "\n")
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.metadata.get("result_present"):
            sys.stderr.write(f"result: {json.dumps(result.result)}\n")
        for a in result.artifacts:
            sys.stderr.write(f"artifact: {a.name} ({a.mime_type}, {a.size} bytes)\n")
        if result.timed_out:
            sys.stderr.write("execbox: timed out (SB005)\n")
        elif result.error_code:
            sys.stderr.write(f"execbox: {result.error_code}: {result.metadata.get('error_message')}\n")
        if result.truncated:
            sys.stderr.write("execbox: output was truncated\n")
    if result.timed_out:
        raise typer.Exit(EXIT_TIMEOUT)
    code_out = result.exit_code
    raise typer.Exit(code_out if 0 <= code_out < 256 else 128 + abs(code_out) % 128)


__all__ = ["EXEC_FIELDS", "exec_json", "handle_exec_request", "register", "run"]


def exec_json(
    json_mode: bool = typer.Option(False, "--json", help="Read one JSON request on stdin, write one JSON reply."),
) -> None:
    """Run one request from another language: JSON on stdin, JSON on stdout (see docs/exec-json.md).

    Exit status 0 when the program ran (whatever its own exit code), 2 when execbox refused or failed
    the request; the reply then holds {"ok": false, "error": {code, message, details}}.
    """
    if not json_mode:
        typer.echo("execbox exec currently speaks only --json (see docs/exec-json.md)", err=True)
        raise typer.Exit(EXIT_ERROR)
    try:
        raw = read_request(sys.stdin.buffer)
        try:
            request = json.loads(raw)
        except (RecursionError, ValueError) as e:  # malformed, not UTF-8, or nested too deeply
            raise InvalidConfigError(f"stdin is not valid JSON: {str(e)[:200] or type(e).__name__}",
                                     details={"field": "request"}) from None
        text = json.dumps(handle_exec_request(request), default=str)
    except SandboxError as e:
        _fail(e, True)
        return
    except Exception as e:  # noqa: BLE001 - the contract: a JSON reply and exit 2, never a traceback
        _fail(internal_error(e), True)
        return
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("exec")(exec_json)
