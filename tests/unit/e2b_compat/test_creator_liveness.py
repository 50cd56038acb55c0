"""The validity cache of E2B sandbox creator tokens: one store lookup per token per TTL, a
revocation seen after the TTL, a failed lookup never cached."""

from __future__ import annotations

import pytest

from execbox.service.e2b_compat.creator import TokenLiveness, store_lookup


def test_cached_for_ttl_then_asked_again() -> None:
    now = [100.0]
    valid = {"tok_a": True}
    asked: list[str] = []

    def lookup(token_id: str) -> bool:
        asked.append(token_id)
        return valid[token_id]

    live = TokenLiveness(lookup, ttl=5.0, clock=lambda: now[0])
    assert live.cached("tok_a") is None
    assert live.check("tok_a") is True and live.check("tok_a") is True and asked == ["tok_a"]
    valid["tok_a"] = False  # revoked
    now[0] += 4.9
    assert live.cached("tok_a") is True  # within the TTL
    now[0] += 0.2
    assert live.cached("tok_a") is None and live.check("tok_a") is False and len(asked) == 2


def test_a_failed_lookup_raises_and_is_not_cached() -> None:
    calls = [0]

    def lookup(token_id: str) -> bool:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("database is down")
        return True

    live = TokenLiveness(lookup, ttl=5.0)
    with pytest.raises(RuntimeError):
        live.check("tok_a")
    assert live.cached("tok_a") is None and live.check("tok_a") is True


def test_store_lookup_sees_revoked_and_unknown_tokens(tmp_path) -> None:  # noqa: ANN001
    from execbox.service.store import open_store

    with open_store(data_dir=str(tmp_path)) as store:
        rec, _ = store.tokens.create("alpha")
        valid = store_lookup(store)
        assert valid(rec.id) is True
        store.tokens.revoke(rec.id)
        assert valid(rec.id) is False and valid("tok_missing") is False
