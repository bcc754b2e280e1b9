"""Alembic's environment for the run log, configured by evaluation.log.db (no alembic.ini): the
connection and the run id of a legacy file's rows come in ``config.attributes``."""

from alembic import context

from evaluation.log.schema import metadata


def run_migrations() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


# Alembic runs this file with its context set; imported otherwise (a tool walking the package),
# it does nothing.
if hasattr(context, "config"):
    run_migrations()
