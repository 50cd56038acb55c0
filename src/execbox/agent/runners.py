"""What runs in a forked child: one function per language. Never returns; ends in ``os._exit``.

Python runs in-process (the fork already has the runners and heavy libraries imported);
JavaScript and bash replace the child with ``node``/``bash``. The value ``main()`` returns is
written as JSON to the result fd, never to stdout.
"""

from __future__ import annotations

import _ast  # the C node types: the ast module (enum, contextlib...) would cost every box start
import builtins
import io
import os
import sys

from . import py_cells
from .lean import dumps
from .pump import clip_text

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
JS_RUNNER = os.path.join(HERE, "js_runner.js")
CODE_FILENAME = "<code>"
AGENT_ARGV = sys.argv
EXIT_WAITS = "exit_waits_for"  # the result-fd record naming the threads a finished program waits for
ARGUMENTS_ENV = "EXECBOX_ARGUMENTS_FILE"  # names the run's arguments as JSON, for bash (one-shot and cell)


def write_result(fd: int, message: dict[str, Any]) -> None:
    data = dumps(message).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _as_list_or_scalar(o: Any) -> Any:
    """numpy scalars and arrays, pandas Series, ``array.array``: what their ``tolist()`` gives
    (``df.x.sum()`` is a numpy int64, the commonest value an analysis returns)."""
    tolist = getattr(o, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def encode_value(value: Any) -> dict[str, Any]:
    """JSON-encode ``main()``'s return value, or explain why it cannot be."""
    try:
        text = dumps(value, allow_nan=False, default=_as_list_or_scalar)
    except (TypeError, ValueError) as e:
        return {"error": f"main() returned a value that is not JSON-serializable ({type(value).__name__}): {e}"}
    return {"present": True, "json": text, "type": type(value).__name__}


def show_source(code: str, filename: str = CODE_FILENAME) -> None:
    """Let tracebacks through ``filename`` (``<code>``, a context's ``<cell 3>``) show its lines,
    as they would for a file. A context keeps every cell's: a function an earlier cell defined
    shows its own lines.

    linecache has no source for a ``<...>`` name unless it is seeded. Importing it just to seed
    it (tokenize, re, enum: ~6 ms) would cost every run forked from an agent that started lean
    (lean.py); so until something imports it (any traceback does), the seed waits for that import.
    """
    entry = (len(code), None, code.splitlines(True), filename)
    linecache = sys.modules.get("linecache")
    if linecache is not None:
        linecache.cache[filename] = entry
        return
    for finder in sys.meta_path:
        if isinstance(finder, _SeedOnImport):  # a context's earlier run: this cell's code joins it
            finder.entries[filename] = entry
            return
    sys.meta_path.insert(0, _SeedOnImport({filename: entry}))


class _SeedOnImport:
    """Meta-path finder that hands linecache, when first imported, a loader that seeds it."""

    def __init__(self, entries: dict[str, tuple[Any, ...]]) -> None:
        self.entries = entries

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "linecache":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _SeedingLoader(spec.loader, self.entries)
                return spec
        return None


class _SeedingLoader:
    def __init__(self, loader: Any, entries: dict[str, tuple[Any, ...]]) -> None:
        self.loader, self.entries = loader, entries

    def __getattr__(self, name: str) -> Any:  # get_source, is_package...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        module.cache.update(self.entries)


def _walk(node: _ast.AST):  # noqa: ANN202 - ast.walk without importing ast
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for field in n._fields:
            v = getattr(n, field, None)
            if isinstance(v, _ast.AST):
                todo.append(v)
            elif isinstance(v, list):
                todo.extend(x for x in v if isinstance(x, _ast.AST))


def uses_main(tree: _ast.Module) -> bool:
    """True if the code reads the name ``main`` (calls it, passes it to ``asyncio.run`` or a
    thread): it runs ``main`` itself, and an implicit call would run it a second time."""
    return any(isinstance(n, _ast.Name) and n.id == "main" and isinstance(n.ctx, _ast.Load) for n in _walk(tree))


def has_main_guard(tree: _ast.Module) -> bool:
    """True if the module has a top-level ``if __name__ == "__main__":`` block."""
    for node in tree.body:
        if isinstance(node, _ast.If) and isinstance(node.test, _ast.Compare):
            names = [n for n in _walk(node.test) if isinstance(n, _ast.Name) and n.id == "__name__"]
            consts = [n for n in _walk(node.test) if isinstance(n, _ast.Constant) and n.value == "__main__"]
            if names and consts:
                return True
    return False


def setup_stdio(line_buffered: bool) -> None:
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=line_buffered,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.stdin = open(os.devnull)  # noqa: SIM115


def flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def extend_path() -> None:
    """Put the box's ``PYTHONPATH`` entries (in-session installs) on ``sys.path`` of this child.

    The agent runs with ``-I`` (no PYTHONPATH), so a package that ``install`` added to the
    workspace after the agent started is found here, at each run, as ``python3`` in bash finds it.
    """
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)
            sys.path_importer_cache.pop(entry, None)  # a miss cached before it existed


def run_python(code: str, arguments: dict[str, Any] | None, globs: dict[str, Any], result_fd: int,
               artifacts_dir: str | None, figure_prefix: str, cell: bool = False) -> int:
    """Run ``code`` in ``globs``; call ``main`` per the contract. Returns the exit code. A context's
    ``cell`` may ``await`` at top level (a one-shot runs as ``python3`` runs a file: it may not)."""
    extend_path()
    if sys.path[:1] != [""]:  # modules beside the code import, as for `python3 -c` and IPython
        sys.path.insert(0, "")
    filename = py_cells.next_filename() if cell else CODE_FILENAME
    show_source(code, filename)
    flags = py_cells.FLAGS if cell else 0
    try:
        tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
        body, shows = py_cells.keep_last(code, tree) if cell and arguments is None else (tree, False)
        compiled = compile(body, filename, "exec", flags)
    except (SyntaxError, ValueError) as e:
        import traceback  # lazily: ~2.4 ms of every box start when imported up front

        text = "".join(traceback.format_exception(type(e), e, None))
        sys.stderr.write(text)
        write_error(result_fd, e, text)
        return 1
    guard = has_main_guard(tree)
    globs["__name__"] = "__execbox__" if (guard and arguments is not None) else "__main__"
    globs.setdefault("__builtins__", builtins)
    if sys.argv is AGENT_ARGV:  # the agent's command line is not the program's (argparse reads it)
        sys.argv, sys.orig_argv = [CODE_FILENAME], [sys.executable, CODE_FILENAME]
    exit_code = 0
    before = globs.get("main")
    raised: tuple[BaseException, str] | None = None
    try:
        if cell:
            py_cells.exec_cell(compiled, globs)
            value = globs.pop(py_cells.OUT, None)
        else:
            exec(compiled, globs)  # noqa: S102 - running the user's program is the point
        main = globs.get("main")
        # With arguments, main() is ours to call. Without, a main this run bound is called unless
        # the program runs as a script (a __main__ guard) or calls main itself; a context's
        # main from an earlier cell is not called again by every later cell, nor one that needs
        # arguments.
        if arguments is not None:
            call_main = callable(main)
        else:
            call_main = not guard and callable(main) and main is not before and not uses_main(tree)
            call_main = call_main and not (cell and py_cells.needs_arguments(main))
        if call_main:
            value = main(**arguments) if arguments else main()
            if type(value).__name__ == "coroutine":  # async def main(): run it as asyncio.run would
                if cell:  # on the context's loop, as the cell's own awaits
                    value = py_cells.run_coroutine(value)
                else:
                    import asyncio

                    value = asyncio.run(value)
            encoded = encode_value(value)
            if "error" in encoded:
                print(f"execbox: {encoded['error']}", file=sys.stderr)
                exit_code = 1
            else:
                write_result(result_fd, {"result": encoded})
        elif arguments:
            print("execbox: arguments were given but the code defines no main() function", file=sys.stderr)
            exit_code = 1
        elif shows and value is not None:  # a cell's last expression, as IPython's Out[]
            write_result(result_fd, {"result": py_cells.shown(value, encode_value(value))})
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - the user's exception is reported, not raised
        if isinstance(e, MemoryError) and (not e.args or type(e).__name__ == "_ArrayMemoryError"):
            write_result(result_fd, {"oom": True})  # an allocation failed (numpy's says so with a message)
        if not py_cells.reported(e):  # one a wrapper's cell reported (E2B's MemoryError) is not printed
            raised = (e, report_exception(e))
        exit_code = 1
    raised = py_cells.take_reported() or raised  # a wrapper's cell reports the user's error itself
    if raised is not None:
        write_error(result_fd, *raised)
    save_figures(artifacts_dir, figure_prefix)
    return exit_code


def is_code_file(name: str) -> bool:
    """The file name of the user's code: a one-shot's ``<code>``, a context's ``<cell N>``."""
    return name == CODE_FILENAME or name.startswith("<cell ")


def report_exception(e: BaseException) -> str:
    """Print the traceback from the user's code down, as ``python3`` prints it (just the
    exception's name and message if there is no memory left to format it); return that text."""
    try:
        import traceback

        tb = e.__traceback__.tb_next if e.__traceback__ else None
        first = tb
        while first is not None and not is_code_file(first.tb_frame.f_code.co_filename):
            first = first.tb_next  # an awaiting cell's: the event loop's frames above the code's
        # no frame of the code: interrupted in the agent's own (an awaiting cell's event loop)
        text = "".join(traceback.format_exception(type(e), e, first))
    except MemoryError:
        text = f"{type(e).__name__}: {_safe_str(e)}\n"
    sys.stderr.write(text)
    return text


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - the user's __str__, as traceback says when it fails
        return "<exception str() failed>"


def error_of(e: BaseException, text: str) -> dict[str, str]:
    """The run's structured error (E2B's and Jupyter's ``name``/``value``/``traceback``): the
    exception's type name, its message, and the traceback text the run printed on stderr."""
    return {"name": type(e).__name__, "value": clip_text(_safe_str(e)), "traceback": clip_text(text)}


def write_error(result_fd: int, e: BaseException, text: str) -> None:
    """``error_of`` on the result fd (where ``pump.parse_result`` reads it)."""
    try:
        write_result(result_fd, {"error": error_of(e, text)})
    except (MemoryError, OSError):  # no memory left, or no result fd (a warm-up): stderr has it
        pass


def finish_python(result_fd: int) -> None:
    """What ``python3`` does at exit before the child's ``os._exit``: wait for the program's
    non-daemon threads (and thread pools), then run its ``atexit`` functions. Without this, work
    a thread had not finished was lost and the run still said exit 0. The threads it waits for
    are named on the result fd first: a run that times out here says what it was waiting for."""
    threading = sys.modules.get("threading")
    if threading is not None:
        me = threading.current_thread()
        waiting = [t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
        if waiting:
            write_result(result_fd, {EXIT_WAITS: waiting[:10]})
            flush_stdio()  # what the finished code printed is out, even if the wait then times out
        try:
            threading._shutdown()
        except BaseException as e:  # noqa: BLE001 - reported, as python3 reports it
            report_exception(e)
    atexit = sys.modules.get("atexit")  # a program that registered none never imported it (0.3 ms)
    if atexit is not None:
        atexit._run_exitfuncs()


def warm_up() -> None:
    """Run an empty program once in a freshly forked child, before its job arrives.

    After a fork, the first writes to the interpreter's pages copy them (copy-on-write); with
    numpy/pandas/matplotlib preloaded that is the bulk of a first run's time, and under gVisor
    page faults are expensive. Paying it while the child waits keeps it off the request.
    """
    setup_stdio(False)
    run_python("pass\n", None, {}, -1, None, "warm-up")
    flush_stdio()


def seed_matplotlib_cache() -> None:
    """Copy a font cache built with the image into this box's empty ``MPLCONFIGDIR``.

    The config dir is the box's private /tmp, empty at every start, so matplotlib's first import
    in each box scanned every font again (~110 ms of a Docker box's start, and of each one-shot
    that plots). ``EXECBOX_MPL_SEED`` names a read-only directory of ``fontlist-*.json`` made at
    image build time for the same paths (colon-separated: a runtime version's, then the base
    image's; the first one holding a given matplotlib version's list wins); a missing seed or an
    existing cache leaves things as they are.
    """
    seeds, target = os.environ.get("EXECBOX_MPL_SEED"), os.environ.get("MPLCONFIGDIR")
    if not seeds or not target:
        return
    for seed in seeds.split(":"):
        if seed:
            _seed_from(seed, target)


def _seed_from(seed: str, target: str) -> None:
    try:
        names = [n for n in os.listdir(seed) if n.startswith("fontlist-") and n.endswith(".json")]
    except OSError:
        return
    for name in names:
        try:
            src = os.open(os.path.join(seed, name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            dst = os.open(os.path.join(target, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644)
        except OSError:  # already there (a cache of the box's own), or no such directory
            os.close(src)
            continue
        try:
            while os.sendfile(dst, src, None, 1 << 20):
                pass
        except OSError:
            pass
        finally:
            os.close(src)
            os.close(dst)


def warm_figures() -> None:
    """Render one throwaway PNG figure in the agent after preloading matplotlib (and pandas).

    The first figure of a process loads the Agg backend, the default font into FreeType, PIL's
    PNG writer and pandas' unit converters. Done once here, before any fork, every run's child
    inherits it; otherwise each forked run paid it again (a warm plot cost ~1.85x the same plot in
    an already-warm interpreter).
    """
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import io

    pd = sys.modules.get("pandas")
    x = pd.Series([0, 1]) if pd is not None else [0, 1]
    fig = plt.figure()
    try:
        ax = fig.add_subplot()
        ax.plot(x, x)
        ax.set_title("warm-up")
        fig.savefig(io.BytesIO(), format="png")
    finally:
        plt.close("all")


def save_figures(artifacts_dir: str | None, prefix: str) -> None:
    """Save open matplotlib figures as PNG artifacts, if the code used pyplot."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not artifacts_dir:
        return
    import warnings

    # What saving warns about (a glyph missing from the font) is the code's figure's, but Python
    # would name the agent's line that called savefig: shown as the warning alone.
    with warnings.catch_warnings(record=True) as caught:
        try:
            nums = plt.get_fignums()
            for i, num in enumerate(nums, 1):
                fig = plt.figure(num)
                fig.savefig(os.path.join(artifacts_dir, f"{prefix}-{i}.png"), format="png")
            plt.close("all")
        except Exception as e:  # noqa: BLE001
            print(f"execbox: could not save matplotlib figures: {e}", file=sys.stderr)
    for w in caught:
        print(f"{w.category.__name__}: {w.message}", file=sys.stderr)


def exec_node(node: str, code_path: str, args_path: str, env: dict[str, str], heap_mb: int | None) -> None:
    argv = [node]
    if heap_mb:
        argv.append(f"--max-old-space-size={heap_mb}")
    argv += [JS_RUNNER, code_path, args_path]
    os.execve(node, argv, env)


BASH_ARG_MAX = 128 * 1024 - 1  # execve's limit on one argument (MAX_ARG_STRLEN)
# Longer code: eval of the file's text (``$(<file)`` reads it without a fork), after ``set --``
# on the same line clears the file's name from ``$1`` (so line numbers stay the program's).
BASH_FROM_FILE = 'eval -- "set --;" "$(<"$1")"'


def exec_bash(bash: str, script_path: str, env: dict[str, str]) -> None:
    """The script runs as ``bash -c CODE bash``, the code itself the argument (never a string
    built around it), so its errors read ``bash: line 3: ...`` as from a terminal or a bash
    kernel, not with the run file's temp path. Code too long for one argument, or holding a NUL,
    is read from its file by a fixed ``-c`` script (BASH_FROM_FILE): errors then name ``eval``."""
    with open(script_path, "rb") as f:
        code = f.read(BASH_ARG_MAX + 1)
    if len(code) <= BASH_ARG_MAX and b"\0" not in code:
        os.execve(bash, [bash, "--noprofile", "--norc", "-c", code, "bash"], env)
    os.execve(bash, [bash, "--noprofile", "--norc", "-c", BASH_FROM_FILE, "bash", script_path], env)
