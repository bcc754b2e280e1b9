"""Alembic's environment for the run log, configured by evaluation.log.db (no alembic.ini): the
connection and the run id of a legacy file's rows come in ``config.attributes``."""

from alembic import context

from evaluation.log.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
