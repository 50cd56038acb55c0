"""Optional Python AST lint (``enable_ast_analysis``): a guard rail, never the security boundary.

It blocks configured imports and calls to configured functions, resolving import aliases so
``import os as o; o.system(...)`` is caught while ordinary methods on ordinary objects
(``df.rename()``, ``lst.remove()``) never are: only names that resolve to a module, or bare
builtins, are checked. Anything it misses is still contained by the box.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import CodeBlockedError

DEFAULT_BLOCKED_IMPORTS = ("ctypes", "subprocess", "socket", "multiprocessing", "pty")
DEFAULT_BLOCKED_CALLS = (
    "os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.execv", "os.execve",
    "os.execvp", "os.spawnv", "os.spawnl", "os.remove", "os.unlink", "os.rmdir", "shutil.rmtree",
    "eval", "exec", "compile", "__import__",
)


@dataclass
class AstPolicy:
    blocked_imports: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_BLOCKED_IMPORTS))
    blocked_calls: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_BLOCKED_CALLS))

    @classmethod
    def from_config(cls, imports: Iterable[str] | None, calls: Iterable[str] | None) -> AstPolicy:
        return cls(
            frozenset(imports) if imports is not None else frozenset(DEFAULT_BLOCKED_IMPORTS),
            frozenset(calls) if calls is not None else frozenset(DEFAULT_BLOCKED_CALLS),
        )

    def _import_blocked(self, module: str) -> str | None:
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            if ".".join(parts[:i]) in self.blocked_imports:
                return ".".join(parts[:i])
        return None

    def check(self, code: str) -> None:
        """Raise CodeBlockedError (SB007) naming the first offending line; syntax errors pass
        through untouched so the user sees Python's own message from the run."""
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return
        aliases: dict[str, str] = {}  # local name -> dotted origin ("o" -> "os", "sys_" -> "os.system")
        lines = code.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self._deny_import(a.name, node, lines)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self._deny_import(node.module, node, lines)
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = self._resolve(node.func, aliases)
                if name and name in self.blocked_calls:
                    self._raise(f"call to {name}() is blocked by the sandbox policy", name, node, lines)

    def _deny_import(self, module: str, node: ast.AST, lines: list[str]) -> None:
        hit = self._import_blocked(module)
        if hit:
            self._raise(f"import of {hit!r} is blocked by the sandbox policy", hit, node, lines)

    @staticmethod
    def _resolve(func: ast.expr, aliases: dict[str, str]) -> str | None:
        """Dotted name of a call target if it starts at an imported name or a bare builtin."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        if func.id in aliases:
            base = aliases[func.id]
        elif parts:
            return None  # an attribute on a local object (df.rename, lst.remove): never flagged
        else:
            base = func.id  # bare call: builtins such as eval/exec
        return ".".join([base, *reversed(parts)])

    @staticmethod
    def _raise(message: str, name: str, node: ast.AST, lines: list[str]) -> None:
        lineno = getattr(node, "lineno", 0)
        source = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        raise CodeBlockedError(
            f"{message} (line {lineno}: {source})",
            details={"line": lineno, "column": getattr(node, "col_offset", 0), "name": name, "source": source},
        )
