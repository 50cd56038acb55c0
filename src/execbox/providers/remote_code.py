"""Code wrapping for cloud code interpreters (E2B, AgentRun) that run our code but not our agent.

The in-box agent gives ``main(**arguments)`` / ``main(arguments)`` semantics, a separate result
channel and artifact collection. A cloud interpreter only runs a cell, so the same semantics are
carried by a small wrapper: the user's code runs unchanged (Python: compiled as ``<code>`` so
line numbers match the agent's), then ``main`` is called and a one-line JSON payload is printed
after a per-run random marker. ``extract_result`` cuts that line out again, so the result never
reaches the caller's stdout.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import secrets
from typing import Any

from ..models import Artifact, TextPage

MARK_PREFIX = "__EXECBOX_RESULT_"
ARTIFACTS_DIR = "artifacts"
MAX_ARTIFACTS = 50


def new_marker() -> str:
    """A marker user code cannot predict (it is generated per run)."""
    return f"{MARK_PREFIX}{secrets.token_hex(8)}__:"


def wrap_python(code: str, arguments: dict[str, Any] | None, marker: str) -> str:
    """User code + main() call + result/artifact payload, as one Python cell.

    The payload is printed in ``finally`` so artifacts are reported even when the code fails.
    """
    args_json = json.dumps(arguments or {})
    return f"""import json as _xb_json, os as _xb_os
_xb_payload = {{"present": False, "value": None, "type": None, "artifacts": []}}
def _xb_snapshot():
    out = {{}}
    base = _xb_os.path.join(_xb_cwd, {ARTIFACTS_DIR!r})
    for d, dirs, files in _xb_os.walk(base):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in files:
            p = _xb_os.path.join(d, f)
            if f.startswith(".") or _xb_os.path.islink(p):
                continue
            st = _xb_os.stat(p)
            out[_xb_os.path.relpath(p, base)] = [st.st_mtime_ns, st.st_size]
    return out
_xb_cwd = _xb_os.getcwd()
_xb_os.makedirs(_xb_os.path.join(_xb_cwd, {ARTIFACTS_DIR!r}), exist_ok=True)
_xb_before = _xb_snapshot()
try:
    exec(compile({code!r}, "<code>", "exec"), globals())
    _xb_args = _xb_json.loads({args_json!r})
    if {bool(arguments)!r} or callable(globals().get("main")):
        _xb_value = main(**_xb_args)
        _xb_json.dumps(_xb_value)
        _xb_payload.update(present=True, value=_xb_value, type=type(_xb_value).__name__)
finally:
    _xb_after = _xb_snapshot()
    _xb_payload["artifacts"] = sorted(k for k, v in _xb_after.items() if _xb_before.get(k) != v)
    print("\\n" + {marker!r} + _xb_json.dumps(_xb_payload, default=repr), flush=True)
"""


def wrap_javascript(code: str, arguments: dict[str, Any] | None, marker: str) -> str:
    """User code + main(args) call + result payload (an async main is awaited via then())."""
    args_json = json.dumps(arguments or {})
    return f"""{code}
;{{
  const __xb_emit = (v) => {{
    const p = v === undefined
      ? {{ present: true, value: null, type: "undefined", artifacts: [] }}
      : {{ present: true, value: v, type: Array.isArray(v) ? "array" : typeof v, artifacts: [] }};
    console.log("\\n" + {json.dumps(marker)} + JSON.stringify(p));
  }};
  if ({json.dumps(bool(arguments))} || typeof main === "function") {{
    const __xb_v = main(JSON.parse({json.dumps(args_json)}));
    if (__xb_v && typeof __xb_v.then === "function") {{ __xb_v.then(__xb_emit); }} else {{ __xb_emit(__xb_v); }}
  }} else {{
    console.log("\\n" + {json.dumps(marker)} + JSON.stringify({{ present: false, value: null, type: null,
                                                              artifacts: [] }}));
  }}
}}
"""


def extract_result(stdout: str, marker: str) -> tuple[str, dict[str, Any] | None]:
    """(stdout without the payload line, payload) - the last marker line wins."""
    start = stdout.rfind("\n" + marker)
    if start < 0:
        if stdout.startswith(marker):  # no user output before the payload
            start = -1
        else:
            return stdout, None
    body_start = start + 1 + len(marker)
    end = stdout.find("\n", body_start)
    line = stdout[body_start:] if end < 0 else stdout[body_start:end]
    try:
        payload = json.loads(line)
    except ValueError:
        return stdout, None
    if not isinstance(payload, dict):
        return stdout, None
    cut_from = max(start, 0)
    cut_to = len(stdout) if end < 0 else end + 1
    return stdout[:cut_from] + stdout[cut_to:], payload


_CONNECT_MARKERS = ("connection refused", "failed to establish a new connection", "name or service not known",
                    "tcp connect error", "temporary failure in name resolution", "network is unreachable",
                    "no route to host")


def is_connect_error(err: BaseException) -> bool:
    """The SDK could not reach the cloud at all (SB003), whatever exception type it wraps that in."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError) or type(e).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        if any(m in str(e).lower() for m in _CONNECT_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def mask_secrets(text: str, secrets_: list[str | None]) -> str:
    """Replace secrets (long enough to be real ones) by their last 4 characters."""
    for secret in secrets_:
        if secret and len(secret) >= 6:
            text = text.replace(secret, f"...{secret[-4:]}")
    return text


def make_artifact(name: str, data: bytes, mime_type: str | None = None) -> Artifact:
    """An Artifact with its bytes attached (cloud instances are gone after a one-shot run)."""
    return Artifact(name=name, mime_type=mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream",
                    size=len(data), sha256=hashlib.sha256(data).hexdigest(), path=f"{ARTIFACTS_DIR}/{name}",
                    _data=data)


def text_page(path: str, data: bytes, offset: int, limit: int) -> TextPage:
    """A page of lines of a downloaded file (clouds have no paged read)."""
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    page = lines[offset:offset + limit]
    return TextPage(path=path, content="".join(page), offset=offset, limit=limit, total_lines=len(lines),
                    truncated=offset + len(page) < len(lines))
