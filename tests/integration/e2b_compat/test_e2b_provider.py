"""execbox's own `e2b` provider against execbox's E2B-compatible endpoint: no fake in between."""

from __future__ import annotations

import pytest

from execbox.errors import SandboxError

from .conftest import Server

pytest.importorskip("e2b_code_interpreter")


@pytest.fixture
def provider(e2b_server: Server):
    from execbox.providers.e2b import E2BProvider

    p = E2BProvider()
    p.initialize({"api_key": e2b_server.token_a, "api_url": e2b_server.url, "sandbox_url": e2b_server.url,
                  "timeout": 60})
    yield p
    p.shutdown()


def test_provider_runs_code_commands_and_files(provider) -> None:
    assert provider.health_check() is True
    inst = provider.create_instance("python", tenant_id="t1", session_id="s1")
    try:
        r = provider.execute_code(inst.instance_id, "def main(n):\n    print('n is', n)\n    return n * 2",
                                  "python", 30, {"n": 21})
        assert (r.exit_code, r.stdout, r.result) == (0, "n is 21\n", 42), r
        r = provider.execute_code(inst.instance_id, "console.log('js ok')", "javascript", 30)
        assert r.exit_code == 0 and r.stdout == "js ok\n", r
        r = provider.execute_code(inst.instance_id, "raise ValueError('nope')", "python", 30)
        assert r.exit_code != 0 and "ValueError" in r.stderr
        r = provider.run_command(inst.instance_id, "echo from bash; exit 4", 30)
        assert (r.stdout, r.exit_code) == ("from bash\n", 4)
        provider.write_file(inst.instance_id, "dir/data.bin", b"\x00\x01\xfe\xff")
        assert provider.read_bytes(inst.instance_id, "dir/data.bin") == b"\x00\x01\xfe\xff"
    finally:
        assert provider.destroy_instance(inst.instance_id) is True


def test_provider_bad_key_is_an_sb_error(e2b_server: Server) -> None:
    from execbox.providers.e2b import E2BProvider

    p = E2BProvider()
    p.initialize({"api_key": "wrong", "api_url": e2b_server.url, "sandbox_url": e2b_server.url})
    assert p.health_check() is False
    with pytest.raises(SandboxError) as err:
        p.create_instance("python")
    assert "wrong" not in str(err.value)
