"""The database URL shown by the admin status, `execbox db status`, logs and errors never holds
its password: with or without a user, in a ``?password=``-like parameter, or unparsable."""

from __future__ import annotations

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.store import open_store, redact_url

PW = "s3cretPW"


@pytest.mark.parametrize("url,shown", [
    (f"postgresql+psycopg://user:{PW}@db/execbox", "postgresql+psycopg://user:****@db/execbox"),
    (f"postgresql+psycopg://:{PW}@db/execbox", "postgresql+psycopg://:****@db/execbox"),
    (f"postgresql+psycopg://user@db/execbox?password={PW}", "postgresql+psycopg://user@db/execbox?password=****"),
    (f"postgresql+psycopg://user@db/x?sslmode=require&sslpassword={PW}&PGPASSWORD={PW}x",
     "postgresql+psycopg://user@db/x?PGPASSWORD=****&sslmode=require&sslpassword=****"),
    (f"mysql+pymysql://u:{PW}%40x@db/x", "mysql+pymysql://u:****@db/x"),
    (f"postgresql://u:{PW}/x@h/db", "postgresql://u:****@h/db"),
    ("sqlite:////var/lib/execbox/execbox.db", "sqlite:////var/lib/execbox/execbox.db"),
    # SQLAlchemy cannot parse these: the pattern hides what it may be
    (f"postgresql://u:{PW}@host:notaport/db?password={PW}", "postgresql://****@host:notaport/db?password=****"),
    (f"u:{PW}@host/db", "****@host/db"),
])
def test_redact_url_hides_every_password(url, shown):
    assert redact_url(url) == shown
    assert PW not in redact_url(url)


def test_an_unusable_database_url_error_does_not_quote_the_password(tmp_path):
    with pytest.raises(InvalidConfigError) as e:
        open_store(tmp_path, url=f"postgresql://u:{PW}@host:notaport/db")
    assert PW not in str(e.value) and PW not in repr(e.value.details)


def test_an_unescaped_at_in_the_password_hides_all_of_it(tmp_path):
    """SQLAlchemy parses ``u:Sup3r@Tail5ecret@host`` as password ``Sup3r`` on host
    ``Tail5ecret@host``: the tail must not be shown as part of the host (review 50, F6)."""
    url = "postgresql://u:Sup3r@Tail5ecret@127.0.0.1:5432/x"
    assert redact_url(url) == "postgresql://****@127.0.0.1:5432/x"
    assert redact_url(url.replace("postgresql", "postgresql+psycopg")) == "postgresql+psycopg://****@127.0.0.1:5432/x"
    with pytest.raises(InvalidConfigError, match="percent-encode special characters") as e:
        open_store(tmp_path, url=url)
    for part in ("Sup3r", "Tail5ecret"):
        assert part not in str(e.value) and part not in repr(e.value.details)
