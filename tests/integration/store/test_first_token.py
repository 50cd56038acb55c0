"""The first-start admin token is made once per store however many processes start at once
(review 50, F5): the check for a live token and the insert are one transaction under the
store's write lock, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

from execbox.service.store import open_store
from execbox.service.store.first_token import create_first_admin_token
from execbox.service.store.repos import TokensRepo


def test_concurrent_first_starts_make_exactly_one_admin_token(db_url, tmp_path, monkeypatch) -> None:
    open_store(tmp_path, url=db_url).close()  # migrated once, as the first process would
    count = TokensRepo.count

    def slow_count(self, role=None):  # widens the window between "none yet" and the insert
        n = count(self, role)
        time.sleep(0.3)
        return n

    monkeypatch.setattr(TokensRepo, "count", slow_count)
    made: list = []
    errors: list = []
    start = threading.Barrier(4)

    def first_start() -> None:
        try:
            with open_store(tmp_path, url=db_url) as store:
                start.wait()
                made.append(create_first_admin_token(store))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    created = [m for m in made if m is not None]
    assert len(made) == 4 and len(created) == 1, made
    with open_store(tmp_path, url=db_url) as store:
        tokens = store.tokens.list()
        assert [(t.tenant_id, t.role, t.name) for t in tokens] == [("default", "admin", "first-start admin")]
        assert store.tokens.verify(created[0][1]).id == tokens[0].id
        assert create_first_admin_token(store) is None  # a later start finds it


def test_no_first_token_when_one_exists_and_again_when_all_are_revoked(db_url, tmp_path) -> None:
    with open_store(tmp_path, url=db_url) as store:
        rec, _ = store.tokens.create("ops", "admin")
        assert create_first_admin_token(store) is None
        store.tokens.revoke(rec.id)
        assert create_first_admin_token(store) is not None  # as before: no live token, a new one
