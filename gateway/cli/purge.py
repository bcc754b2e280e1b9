"""``neurosandbox purge``: erase a patient's or a study's data from every place the sandbox keeps
it (``gateway.purge``), or everything older than a number of days."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from rich.table import Table

from gateway.cli.console import fail, table_console


def purge_command(
    patient: Annotated[
        str | None, typer.Option("--patient", help="PatientID (with --issuer when it has one)")
    ] = None,
    issuer: Annotated[
        str | None,
        typer.Option(
            "--issuer",
            help="IssuerOfPatientID of --patient (default: whichever the patient's data carry; "
            "refused, naming them, when they carry two)",
        ),
    ] = None,
    study: Annotated[
        str | None, typer.Option("--study", help="StudyInstanceUID (every patient under it)")
    ] = None,
    older_than: Annotated[
        float | None,
        typer.Option(
            "--older-than", help="DAYS: every run and study older than this (as retention does)"
        ),
    ] = None,
    pacs: Annotated[
        bool,
        typer.Option(
            "--pacs",
            help="also delete the SRs and PDFs the sandbox wrote into Orthanc (never the "
            "hospital's images)",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be removed; remove nothing")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the report as JSON on stdout")] = False,
) -> None:
    """Erase a patient's or study's runs, reports, spool, caches, study state, review log
    entries, suite-run cases and registered cases; leave an audit entry that names no one."""
    from gateway.audit import AuditLog
    from gateway.orthanc import OrthancClient, OrthancError
    from gateway.purge import Places, PurgeError, Purger, PurgeTarget
    from gateway.settings import get_settings

    settings = get_settings()
    try:
        target = PurgeTarget.of(
            patient_id=patient, issuer=issuer, study_uid=study, older_than_days=older_than
        )
    except PurgeError as exc:
        raise fail(f"{exc} (--patient ID | --study UID | --older-than DAYS)", 2) from None
    audit = AuditLog.from_settings(settings)
    orthanc = OrthancClient.from_settings(settings) if pacs else None
    try:
        report = Purger(Places.from_settings(settings), orthanc=orthanc, audit=audit).purge(
            target, dry_run=dry_run, pacs=pacs, actor=f"cli:{getpass.getuser()}"[:64]
        )
    except PurgeError as exc:
        raise fail(str(exc), 2) from None
    except OrthancError as exc:
        raise fail(f"the PACS: {exc} (nothing else was removed)", 1) from None
    finally:
        audit.close()
        if orthanc is not None:
            orthanc.close()
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        _print(report)
    if report.left:
        raise typer.Exit(1)


def _print(report: object) -> None:
    from gateway.purge import PurgeReport

    assert isinstance(report, PurgeReport)
    verb = "would remove" if report.dry_run else "removed"
    table = Table(title=f"purge ({report.kind}): {verb}", show_header=True)
    table.add_column("place")
    table.add_column("count", justify="right")
    for name, value in report.counts.model_dump().items():
        table.add_row(name.replace("_", " "), str(value))
    table_console().print(table)
    if report.issuers:
        shown = ", ".join(i or "(none)" for i in report.issuers)
        table_console().print(f"issuers matched: {shown}", markup=False)
    for line in report.left:
        table_console().print(f"left: {line}", markup=False)
    if report.subject:
        table_console().print(f"audit subject: {report.subject}", markup=False)
