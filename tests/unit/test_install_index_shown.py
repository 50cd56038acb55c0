"""What a tenant's install error shows of the operator's index: ``scheme://host[:port]/…`` only,
never a token in its query (refused at the setting) or path (scrubbed from messages, details and
the tool's output); and the package pip itself says it could not find (a build requirement)."""

from __future__ import annotations

import pytest

from execbox.boxes.runtime_build import check_index_url
from execbox.egress.policy import EgressPolicy
from execbox.errors import ConnectionFailedError, InvalidConfigError
from execbox.models import ExecutionResult
from execbox.providers import install


@pytest.mark.parametrize("url", ["https://pkgs.example.com/simple?token=SEKRET999",
                                 "https://pkgs.example.com/simple/?api-key=SEKRET999&x=1",
                                 "https://pkgs.example.com/simple#SEKRET999", "https://pkgs.example.com/simple?"])
@pytest.mark.parametrize("field", ["EXECBOX_PIP_INDEX_URL", "EXECBOX_NPM_REGISTRY"])
def test_an_index_url_with_a_query_or_fragment_is_refused_naming_only_the_variable(url, field):
    with pytest.raises(InvalidConfigError) as e:
        check_index_url(url, field)
    text = f"{e.value.message} {e.value.details}"
    assert "SEKRET999" not in text and "/simple" not in text and "token" not in text
    assert field in e.value.message and "https://pkgs.example.com/…" in e.value.message
    assert e.value.details == {"field": field}


TOKEN_URL = "http://mirror.example:8080/tok-SEKRET999/simple"


def _failed(tail: str, reason: str, package: str | None = None) -> ExecutionResult:
    return ExecutionResult("", "", 0, 0.1, result={"ok": False, "tool": "pip", "reason": reason,
                                                   "package": package, "tail": tail})


@pytest.mark.parametrize(("reason", "error"), [("unknown_package", InvalidConfigError),
                                               ("index_unreachable", ConnectionFailedError),
                                               ("failed", InvalidConfigError)])
def test_a_token_in_the_index_path_reaches_no_tenant_facing_text(reason, error):
    tail = (f"Looking in indexes: {TOKEN_URL}\nCould not fetch URL {TOKEN_URL}/nopkg/: 404\n"
            "ERROR: No matching distribution found for nopkg")
    with pytest.raises(error) as e:
        install._outcome(_failed(tail, reason, "nopkg"), ["nopkg"], [], TOKEN_URL, None, 30, 1 << 20,
                         EgressPolicy("allowlist", ()))
    text = f"{e.value.message} {e.value.details}"
    assert "SEKRET999" not in text, text
    assert e.value.details["index"] == "http://mirror.example:8080/…"
    assert "Looking in indexes: http://mirror.example:8080/…" in e.value.details["output"]
    assert "http://mirror.example:8080/…/nopkg/" in e.value.details["output"]


def test_a_missing_build_requirement_is_named_not_the_requested_package():
    tail = "ERROR: No matching distribution found for setuptools>=40.8.0"
    with pytest.raises(InvalidConfigError) as e:
        install._outcome(_failed(tail, "missing_dependency", "setuptools>=40.8.0"), ["sdpkg"], [], TOKEN_URL,
                         None, 30, 1 << 20, EgressPolicy("allowlist", ()))
    assert e.value.http_status == 404 and "'setuptools>=40.8.0'" in e.value.message
    assert "needed by sdpkg (a dependency or build requirement)" in e.value.message
    assert "package 'sdpkg' was not found" not in e.value.message
    assert e.value.details["package"] == "setuptools>=40.8.0" and e.value.details["dependency"] is True


SDIST_OUTPUT = """Collecting sdpkg
  Downloading http://pkgs.test/pkgs/files/sdpkg-1.0.tar.gz (400 bytes)
  Installing build dependencies: started
  Installing build dependencies: finished with status 'error'
  error: subprocess-exited-with-error

  x pip subprocess to install build dependencies did not run successfully.
  | exit code: 1
  > [3 lines of output]
      Looking in indexes: http://pkgs.test/pkgs/simple
      ERROR: Could not find a version that satisfies the requirement setuptools>=40.8.0 (from versions: none)
      ERROR: No matching distribution found for setuptools>=40.8.0
      [end of output]
"""


@pytest.fixture
def program():
    """The program that runs in the box, with its index probe answered without network."""
    ns: dict = {}
    exec(compile(install.PROGRAM, "install-program", "exec"), ns)  # noqa: S102 - our own fixed program
    ns["reachable"] = lambda url: True
    return ns


def test_classify_takes_the_missing_name_from_pips_own_line(program):
    classify = program["classify"]
    assert classify("pip", SDIST_OUTPUT, ["sdpkg"], "x") == ("missing_dependency", "setuptools>=40.8.0")
    text = "ERROR: No matching distribution found for Sd_Pkg==2.0"
    assert classify("pip", text, ["other", "sd-pkg>=1"], "x") == ("unknown_package", "sd-pkg>=1")
    npm = ("npm error 404 Not Found - GET http://r.test/npm/leftpadx - Not found\n"
           "npm error 404  'leftpadx@^1.0.0' is not in this registry.")
    assert classify("npm", npm, ["myjs"], "x") == ("missing_dependency", "leftpadx")
    assert classify("npm", npm.replace("leftpadx", "@s/myjs"), ["@s/myjs@1"], "x") == ("unknown_package",
                                                                                       "@s/myjs@1")
