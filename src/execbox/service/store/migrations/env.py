"""Alembic environment: runs on the connection execbox hands over (``config.attributes``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from execbox.service.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), hide_parameters=True)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
