"""``neurosandbox db status|upgrade``: the PostgreSQL run log named by the settings
(``NEUROSANDBOX_DATABASE_URL``) against the schema this code reads, and its migration."""

from __future__ import annotations

import typer

from gateway.cli.console import ExitCode, fail, table_console

db_app = typer.Typer(help="The run log's database (PostgreSQL): status and upgrade.")


def _url() -> str:
    from gateway.settings import get_settings

    url = get_settings().database_url
    if not url:
        raise fail(
            "no database configured (NEUROSANDBOX_DATABASE_URL): each run keeps its own "
            "run.sqlite, upgraded when opened",
            ExitCode.USAGE,
        )
    return url


@db_app.command("status")
def status_command() -> None:
    """The schema revision of the run log against the one this code reads (exit 1: behind)."""
    from evaluation import EvaluationError
    from evaluation.log import schema_status

    try:
        st = schema_status(_url())
    except EvaluationError as exc:
        raise fail(str(exc), 1) from None
    console = table_console()
    state = "up to date" if st.up_to_date else "out of date: run `neurosandbox db upgrade`"
    console.print(f"{st.url}: schema {st.current or 'none'}, this code reads {st.head} ({state})")
    if not st.up_to_date:
        raise typer.Exit(1)


@db_app.command("upgrade")
def upgrade_command() -> None:
    """Migrate the run log to the schema this code reads (an empty database: created)."""
    from evaluation import EvaluationError
    from evaluation.log import schema_status, upgrade

    url = _url()
    try:
        before = schema_status(url).current
        after = upgrade(url)
    except EvaluationError as exc:
        raise fail(str(exc), 1) from None
    table_console().print(
        f"{after.url}: schema {before or 'none'} -> {after.current}"
        + (" (nothing to do)" if before == after.current else "")
    )
    import psycopg

    from gateway.jobs import QueueError, apply_schema

    try:
        created = apply_schema(url)
    except (QueueError, psycopg.Error) as exc:
        raise fail(f"the queue's tables (procrastinate): {exc}", 1) from None
    table_console().print(
        "the queue's tables (procrastinate): " + ("created" if created else "present")
    )
