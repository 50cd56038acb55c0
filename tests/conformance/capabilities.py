"""What each provider declares it cannot do, with the reason: the one source of truth.

The conformance suite skips a declared case with its reason (visible in `pytest -ra`), and
scripts/gen_capabilities.py renders this table into docs/providers.md. Anything not declared
here must pass the case exactly like the jail does.
"""

from __future__ import annotations

PROVIDERS = ["local", "jail", "docker-runc", "docker-runsc", "kubernetes", "self_managed", "self_managed-run", "e2b",
             "e2b-execbox", "aliyun"]
"""Conformance ids: registry names, with docker split by OCI runtime and self_managed by its ``api``
(``self_managed``: api execbox, the remote is an execbox service; ``self_managed-run``: RAGFlow's /run)
and e2b by its cloud (``e2b``: the fake of E2B's APIs; ``e2b-execbox``: execbox's E2B-compatible endpoint)."""

CASES: dict[str, str] = {
    "python_main_arguments": "main(**arguments) is called; its JSON value travels in `result`, not stdout",
    "python_non_json_result": "a non-JSON return value is a clear error (exit 1, message on stderr)",
    "python_dunder_main_script": "a script with `if __name__ == '__main__':` runs as a script; main is not called",
    "python_main_called_once": "a program that calls its own main() runs it once (not again implicitly)",
    "python_plain_script": "a plain script runs; no result",
    "javascript_main_arguments": "main(arguments) in Node; its JSON value travels in `result`",
    "javascript_es_module": "code with `import` or top-level `await` runs as an ES module; an exported main is called",
    "bash_script": "bash code runs with stdout, stderr and the exit code kept apart",
    "exit_codes": "sys.exit(3), process.exit(5), bash `exit 7` surface as those exit codes",
    "execution_error": ("an uncaught Python or JavaScript exception is the result's `error` {name, value, "
                        "traceback}; a run that raised nothing has none"),
    "unicode_output": "UTF-8 output (accents, CJK, emoji) arrives unchanged",
    "binary_output": "bytes that are not UTF-8 arrive as U+FFFD replacement characters, never a crash",
    "stdout_cap": "stdout beyond the cap is cut and `truncated` is set",
    "stderr_cap": "stderr beyond the cap is cut and `truncated` is set",
    "timeout": "a run past its timeout is killed: `timed_out`, error SB005",
    "timeout_sigterm_ignored": "a child that ignores SIGTERM is killed with the run (SB005)",
    "background_ends_with_run": "a process a run leaves in the background ends with the run",
    "daemon_ends_with_timeout": "a double-forked daemon ends when its run times out",
    "memory_bomb": "allocating past the memory limit is SB006 and the instance stays usable or is replaced",
    "fork_bomb": "a fork bomb is contained: the run fails or times out and a new instance works",
    "artifacts": "files written under artifacts/ are reported with name, size, sha256 and bytes",
    "plots": "an open matplotlib figure becomes a PNG artifact",
    "file_operations": "write, read (paged), list, glob and grep on the workspace",
    "file_search_and_size": ("grep searches a file of any size, names a binary file that matches and says "
                             "`truncated` past max_results, as glob does; a file over 64 MiB is paged as text and "
                             "read in byte ranges (whole: 413 with its limit and size)"),
    "path_traversal_refused": "'..', absolute paths and symlinks leaving the workspace are SB002",
    "python_contexts": ("globals persist per context_id (a cell may `await` at top level); other contexts do not "
                        "see them"),
    "bash_contexts": "shell variables and the working directory persist per context_id; an error ends the cell only",
    "javascript_contexts": ("globals persist per context_id; a cell may `await` and `import` at top level and "
                            "declare a name again"),
    "context_interrupt": ("a Python or JavaScript context cell past its timeout is interrupted (SB005) and its "
                          "context keeps its state, as a notebook's interrupt"),
}

NEEDS_MATPLOTLIB = "the provider's default runtime has no matplotlib"
NO_CGROUP = "no cgroup: memory is capped by RLIMIT_AS, so a bomb is a MemoryError (exit 1), not an OOM kill"
FAKE_CLOUD = ("the test fake runs code as host processes with no memory or pids limit (a real cloud VM has its "
              "own); the bomb would hit the test machine")
REMOTE_EXECUTOR = "RAGFlow's /run API has no files, contexts or sessions"

RAGFLOW_LANGS = "RAGFlow's /run API runs python and nodejs only (no bash)"
RAGFLOW_MAIN = "RAGFlow's /run contract calls main() whenever the code defines it"
NO_BASH = "the AgentRun code interpreter runs python and javascript only"
RAGFLOW_NO_ERROR = "RAGFlow's /run answer has no field for the program's exception (only its stderr)"

UNSUPPORTED: dict[str, dict[str, str]] = {
    "local": {
        "memory_bomb": NO_CGROUP,
        "fork_bomb": "no pid namespace or pids limit: a fork bomb would take the host down",
    },
    "jail": {},
    "docker-runc": {},
    "docker-runsc": {},
    "kubernetes": {},  # pods of the docker worker image, via the in-test API server (tests/integration/kubernetes)
    "self_managed": {},  # api: execbox, against a real `execbox serve` (jail, sci runtime)
    "self_managed-run": {
        "python_dunder_main_script": RAGFLOW_MAIN,
        "python_main_called_once": RAGFLOW_MAIN,
        "bash_script": RAGFLOW_LANGS,
        "exit_codes": RAGFLOW_LANGS,
        "execution_error": RAGFLOW_NO_ERROR,
        "fork_bomb": RAGFLOW_LANGS,
        "file_operations": REMOTE_EXECUTOR,
        "file_search_and_size": REMOTE_EXECUTOR,
        "path_traversal_refused": REMOTE_EXECUTOR,
        "python_contexts": REMOTE_EXECUTOR,
        "bash_contexts": RAGFLOW_LANGS,
        "javascript_contexts": REMOTE_EXECUTOR,
        "context_interrupt": REMOTE_EXECUTOR,
        "timeout_sigterm_ignored": REMOTE_EXECUTOR + " (the check reads a file)",
        "background_ends_with_run": REMOTE_EXECUTOR + " (the check reads a file)",
        "daemon_ends_with_timeout": REMOTE_EXECUTOR + " (the check reads a file)",
        "memory_bomb": REMOTE_EXECUTOR + " (the check reuses the session)",
        "plots": NEEDS_MATPLOTLIB + " (the test's remote execbox runs the jail's system runtime)",
    },
    "e2b": {
        "memory_bomb": FAKE_CLOUD,
        "fork_bomb": FAKE_CLOUD,
        "python_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "bash_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "javascript_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "context_interrupt": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "plots": NEEDS_MATPLOTLIB + " (the test fake runs the host's system python3)",
    },
    "e2b-execbox": {
        "python_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "bash_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "javascript_contexts": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
        "context_interrupt": "E2B contexts are not mapped yet (each request is a one-shot agent run)",
    },
    "aliyun": {
        "bash_script": NO_BASH,
        "exit_codes": NO_BASH,
        "path_traversal_refused": NO_BASH + " (the check makes symlinks with bash)",
        "background_ends_with_run": NO_BASH + " (the check backgrounds a bash loop)",
        "memory_bomb": FAKE_CLOUD,
        "fork_bomb": FAKE_CLOUD,
        "python_contexts": "AgentRun contexts are not mapped yet (each request is a one-shot agent run)",
        "bash_contexts": NO_BASH,
        "javascript_contexts": "AgentRun contexts are not mapped yet (each request is a one-shot agent run)",
        "context_interrupt": "AgentRun contexts are not mapped yet (each request is a one-shot agent run)",
        "plots": NEEDS_MATPLOTLIB + " (the test fake runs the host's system python3)",
    },
}


def declared(provider: str, case: str) -> str | None:
    """The reason ``provider`` cannot run ``case``, or None when it must pass."""
    assert provider in UNSUPPORTED, provider
    assert case in CASES, case
    return UNSUPPORTED[provider].get(case)
