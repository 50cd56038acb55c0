import hashlib

import pytest

from execbox.errors import InvalidConfigError
from execbox.models import Artifact, ExecutionResult, Language, make_instance_id, split_instance_id


@pytest.mark.parametrize("alias,lang", [("python", "python"), ("py", "python"), ("nodejs", "javascript"),
                                        ("js", "javascript"), ("JavaScript", "javascript"), ("bash", "bash"),
                                        ("sh", "bash")])
def test_language_aliases(alias, lang):
    assert Language.parse(alias).value == lang


def test_unknown_language_names_field():
    with pytest.raises(InvalidConfigError) as ei:
        Language.parse("cobol")
    assert ei.value.details["field"] == "language"


def test_instance_id_scoped():
    iid = make_instance_id("t1", "s1")
    tenant, session, uid = split_instance_id(iid)
    assert (tenant, session) == ("t1", "s1") and len(uid) == 32


def test_artifact_checks_sha():
    data = b"hello"
    a = Artifact("x.txt", "text/plain", 5, hashlib.sha256(data).hexdigest(), _data=data)
    assert a.read_bytes() == data
    bad = Artifact("x.txt", "text/plain", 5, "0" * 64, _fetcher=lambda p: data)
    with pytest.raises(InvalidConfigError):
        bad.read_bytes()
    orphan = Artifact("y", "text/plain", 1, "0" * 64)
    with pytest.raises(InvalidConfigError):
        orphan.read_bytes()


def test_result_roundtrip_and_raise():
    r = ExecutionResult("o", "e", 0, 0.1, metadata={"error_code": "SB005", "error_message": "slow"},
                        timed_out=True)
    d = r.to_dict()
    again = ExecutionResult.from_dict(d)
    assert again.timed_out and again.error_code == "SB005"
    from execbox.errors import ExecutionTimeoutError

    with pytest.raises(ExecutionTimeoutError):
        again.raise_for_status()
