"""What each provider declares about the shared cases, with the reason: the one source of truth.

A declaration is one of three kinds (scripts/gen_capabilities.py renders them apart in docs/providers.md):

- ``cannot``: a real limit of the backend or of the wire it speaks (RAGFlow's /run has no files);
- ``not_yet``: the backend could, execbox has not built it (contexts on the cloud providers);
- ``untested``: the provider can, the test's stand-in for its cloud cannot (the fakes have no matplotlib).

The conformance suite runs every declared case as a strict xfail: a case that passes although it is
declared fails the suite, so a declaration cannot go stale. Only a declaration marked ``harms_host``
(a bomb where nothing but the host would stop it) or ``racy`` (a known race: the case passes or
fails by timing) is skipped instead. Anything not declared here
must pass the case exactly like the jail does.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    "exit_codes_python": "sys.exit(3) surfaces as exit code 3",
    "exit_codes_javascript": "process.exit(5) surfaces as exit code 5",
    "exit_codes_bash": "bash `exit 7` surfaces as exit code 7",
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
    "fork_bomb_bash": ("a bash fork bomb is contained: the run fails or times out (SB005), or the box is "
                       "OOM-killed (SB006), and the instance (or a new one) works"),
    "fork_bomb_python": "a Python `os.fork()` bomb is contained, as the bash one",
    "artifacts": "files written under artifacts/ are reported with name, size, sha256 and bytes",
    "plots": "an open matplotlib figure becomes a PNG artifact",
    "file_operations": "write, read (paged), list, glob and grep on the workspace",
    "file_search_and_size": ("grep searches a file of any size, names a binary file that matches and says "
                             "`truncated` past max_results, as glob does; a file over 64 MiB is paged as text and "
                             "read in byte ranges (whole: 413 with its limit and size)"),
    "path_traversal_refused": "'..', absolute paths and symlinks leaving the workspace are SB002",
    "invalid_requests": "an unknown language and a timeout of 0 or below are SB002; the instance stays usable",
    "unknown_instance": "a run on an instance that never existed is SessionNotFoundError (404)",
    "destroyed_instance": "a run on an instance just destroyed is SessionNotFoundError (404)",
    "missing_file": "reading a missing file is FileNotFoundInSandbox (404)",
    "instances_isolated": "a file one instance writes is not visible in another instance of the same provider",
    "python_contexts": ("globals persist per context_id (a cell may `await` at top level); other contexts do not "
                        "see them"),
    "bash_contexts": "shell variables and the working directory persist per context_id; an error ends the cell only",
    "javascript_contexts": ("globals persist per context_id; a cell may `await` and `import` at top level and "
                            "declare a name again"),
    "context_interrupt": ("a Python or JavaScript context cell past its timeout is interrupted (SB005) and its "
                          "context keeps its state, as a notebook's interrupt"),
}



@dataclass(frozen=True)
class Declaration:
    kind: str  # "cannot", "not_yet" or "untested"
    reason: str
    harms_host: bool = False  # skipped, never run: only the host would stop it
    racy: bool = False  # skipped: a known race makes the case pass or fail by timing (a strict xfail would flap)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


KINDS = {"cannot": "impossible", "not_yet": "not built yet", "untested": "untestable here"}
"""How the suite and the docs name each kind."""


def cannot(reason: str, *, harms_host: bool = False) -> Declaration:
    return Declaration("cannot", reason, harms_host)


def not_yet(reason: str, *, racy: bool = False) -> Declaration:
    return Declaration("not_yet", reason, racy=racy)


def untested(reason: str, *, harms_host: bool = False) -> Declaration:
    return Declaration("untested", reason, harms_host)


FAKE_MATPLOTLIB = untested("the test fake runs the host's system python3, which has no matplotlib (the real "
                           "template has it)")
FAKE_BOMB = untested("the test fake runs code as host processes in bubblewrap with no memory or pids limit (a real "
                     "cloud VM has its own); the bomb would hit the test machine", harms_host=True)
REMOTE_EXECUTOR = cannot("RAGFlow's /run API has no files, contexts or sessions")
REMOTE_EXECUTOR_FILE = cannot("RAGFlow's /run API has no files or sessions: the check reads a file the run left")
RAGFLOW_LANGS = cannot("RAGFlow's /run API runs python and nodejs only (no bash)")
RAGFLOW_MAIN = cannot("RAGFlow's /run contract calls main() whenever the code defines it")
RAGFLOW_NO_ERROR = cannot("RAGFlow's /run answer has no field for the program's exception (only its stderr)")
E2B_CONTEXTS = not_yet("E2B contexts are not mapped yet: each request is a one-shot agent run (a resident agent "
                       "per sandbox, over `commands.run(background=True, stdin=True)`, would keep them)")
AGENTRUN_CONTEXTS = not_yet("AgentRun contexts are not mapped yet: each request is a one-shot agent run (a "
                            "persistent AgentRun context holding the agent would keep them)")

UNSUPPORTED: dict[str, dict[str, Declaration]] = {
    "local": {
        "fork_bomb_bash": cannot("no pid namespace or pids limit: a fork bomb would take the host down",
                                 harms_host=True),
        "fork_bomb_python": cannot("no pid namespace or pids limit: a fork bomb would take the host down",
                                   harms_host=True),
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
        "exit_codes_bash": RAGFLOW_LANGS,
        "execution_error": RAGFLOW_NO_ERROR,
        "fork_bomb_bash": RAGFLOW_LANGS,
        "file_operations": REMOTE_EXECUTOR,
        "missing_file": REMOTE_EXECUTOR,
        "instances_isolated": REMOTE_EXECUTOR_FILE,
        "file_search_and_size": REMOTE_EXECUTOR,
        "path_traversal_refused": REMOTE_EXECUTOR,
        "python_contexts": REMOTE_EXECUTOR,
        "bash_contexts": RAGFLOW_LANGS,
        "javascript_contexts": REMOTE_EXECUTOR,
        "context_interrupt": REMOTE_EXECUTOR,
        "timeout_sigterm_ignored": REMOTE_EXECUTOR_FILE,
        "background_ends_with_run": REMOTE_EXECUTOR_FILE,
        "daemon_ends_with_timeout": REMOTE_EXECUTOR_FILE,
        "plots": untested("the test's remote execbox runs the jail's system runtime, which has no matplotlib"),
    },
    "e2b": {
        "fork_bomb_bash": FAKE_BOMB,
        "fork_bomb_python": FAKE_BOMB,
        "python_contexts": E2B_CONTEXTS,
        "bash_contexts": E2B_CONTEXTS,
        "javascript_contexts": E2B_CONTEXTS,
        "context_interrupt": E2B_CONTEXTS,
        "plots": FAKE_MATPLOTLIB,
    },
    "e2b-execbox": {
        "python_contexts": E2B_CONTEXTS,
        "bash_contexts": E2B_CONTEXTS,
        "javascript_contexts": E2B_CONTEXTS,
        "context_interrupt": E2B_CONTEXTS,
    },
    "aliyun": {
        "memory_bomb": FAKE_BOMB,
        "fork_bomb_bash": FAKE_BOMB,
        "fork_bomb_python": FAKE_BOMB,
        "python_contexts": AGENTRUN_CONTEXTS,
        "bash_contexts": AGENTRUN_CONTEXTS,
        "javascript_contexts": AGENTRUN_CONTEXTS,
        "context_interrupt": AGENTRUN_CONTEXTS,
        "plots": FAKE_MATPLOTLIB,
    },
}

NOTES: dict[str, str] = {
    "aliyun": ("bash (`bash_script`, `exit_codes_bash`, `run_command`) runs through execbox's agent in the VM, "
               "so the AgentRun template must have bash (verified only against the fake, which runs the host's); "
               "on a template without it a failed bash run is SB002 (HTTP 501) naming the template."),
    "self_managed-run": ("a fork or memory bomb over /run is contained by the remote executor's own box, not "
                         "by the provider."),
}
"""Per-provider notes rendered under the table: requirements the cases assume of the real backend."""


def declared(provider: str, case: str) -> Declaration | None:
    """What ``provider`` declares about ``case``, or None when it must pass."""
    assert provider in UNSUPPORTED, provider
    assert case in CASES, case
    return UNSUPPORTED[provider].get(case)
