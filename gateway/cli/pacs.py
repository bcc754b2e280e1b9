"""``neurosandbox pacs``: the local Orthanc (Debian package) on loopback ports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import console, fail
from gateway.orthanc_pg import DEFAULT_INDEX_CONNECTIONS, DEFAULT_PASSWORD_ENV
from gateway.settings import get_settings

pacs_app = typer.Typer(
    help="The local Orthanc (Debian package) on loopback ports.", no_args_is_help=True
)


@pacs_app.command("up")
def pacs_up(
    as_json: Annotated[bool, typer.Option("--json", help="print the endpoints as JSON")] = False,
) -> None:
    """Start the local Orthanc (or reuse the running one) and print where everything is."""
    from gateway.pacs_local import LocalPacs, PacsError

    pacs = LocalPacs(get_settings())
    try:
        ep = pacs.up()
    except PacsError as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(ep.model_dump_json(indent=2))
    else:
        console.print(
            f"Orthanc {ep.orthanc_url} (DICOM {ep.orthanc_aet}@127.0.0.1:{ep.orthanc_dicom_port})"
        )
        console.print(f"user {ep.username}, password in {escape(str(ep.password_file))}")


@pacs_app.command("down")
def pacs_down() -> None:
    """Stop the local Orthanc started from this data folder, and a gateway `neurosandbox demo`
    left running with it (by their PIDs)."""
    from gateway.pacs_local import LocalPacs, stop_gateway

    settings = get_settings()
    stop_gateway(settings.data_dir)
    stopped = LocalPacs(settings).down()
    console.print("Orthanc stopped" if stopped else "Orthanc was not running")


@pacs_app.command("status")
def pacs_status(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    show_password: Annotated[
        bool, typer.Option("--show-password", help="include the password itself in the JSON")
    ] = False,
) -> None:
    """Whether Orthanc runs, and its endpoints: orthanc_url, username, password_file, ports, AEs."""
    from gateway.pacs_local import LocalPacs, orthanc_password, resolve_endpoints

    settings = get_settings()
    pacs = LocalPacs(settings)
    status = pacs.status()
    status |= resolve_endpoints(settings).model_dump()  # settings override the recorded ports
    status["running"] = pacs.pid() is not None
    if show_password:
        status["password"] = orthanc_password(settings)
    if as_json:
        json.dump(status, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for k, v in status.items():
        console.print(f"{k:20} {escape(str(v))}")
    if not status["running"]:
        raise typer.Exit(3)


@pacs_app.command("config")
def pacs_config(
    out: Annotated[Path, typer.Option("--out", help="where to write the Orthanc JSON (0600)")],
    gateway_host: Annotated[
        str, typer.Option(help="address Orthanc sees the gateway at")
    ] = "127.0.0.1",
    plugins: Annotated[
        list[str] | None,
        typer.Option(
            help="plugin folder or file inside the Orthanc container/host (repeat for several); "
            "default: Debian's DICOMweb plugin, plus Debian's orthanc-postgresql plugins when "
            "a PostgreSQL URL is given"
        ),
    ] = None,
    storage: Annotated[str, typer.Option(help="Orthanc storage folder")] = "/var/lib/orthanc/db",
    remote_access: Annotated[
        bool, typer.Option(help="allow REST from other hosts (containers on a private network)")
    ] = False,
    postgresql: Annotated[
        str | None,
        typer.Option(
            "--postgresql",
            help="keep the index and the DICOM files in this PostgreSQL database "
            "(postgresql://USER@HOST:PORT/DB, no password: see --password-env)",
        ),
    ] = None,
    password_env: Annotated[
        str,
        typer.Option(
            help="the variable holding the PostgreSQL password; the file says ${NAME} and "
            "Orthanc reads it from its environment when it starts",
        ),
    ] = DEFAULT_PASSWORD_ENV,
    inline_password: Annotated[
        bool,
        typer.Option(help="write the PostgreSQL password itself (read from --password-env now)"),
    ] = False,
    index_connections: Annotated[
        int, typer.Option(help="PostgreSQL connections of this Orthanc's index (2-100)")
    ] = DEFAULT_INDEX_CONNECTIONS,
    reader: Annotated[
        bool,
        typer.Option(
            help="an Orthanc that serves reads of a database another Orthanc receives into "
            "(SaveJobs off: one jobs registry per database)"
        ),
    ] = False,
) -> None:
    """Render deploy/orthanc/orthanc.json.j2 for another Orthanc (e.g. the compose service).

    The REST password comes from NEUROSANDBOX_ORTHANC_PASSWORD or
    NEUROSANDBOX_ORTHANC_PASSWORD_FILE. With --postgresql, the configuration is for Debian's
    orthanc-postgresql (index and storage in the database, Lock off so that several Orthancs
    share it); the PostgreSQL password stays out of the command line and, unless
    --inline-password, out of the file.
    """
    from gateway.orthanc_pg import (
        DEBIAN_PG_PLUGINS,
        OrthancPostgresUrlError,
        parse_postgresql_url,
        postgresql_section,
    )
    from gateway.pacs_local import (
        DEBIAN_PLUGINS,
        orthanc_password,
        render_config,
        resolve_endpoints,
        write_secret,
    )

    pg_section = None
    if postgresql is not None:
        try:
            pg_section = postgresql_section(
                parse_postgresql_url(postgresql),
                password_env=password_env,
                inline_password=inline_password,
                index_connections=index_connections,
            )
        except OrthancPostgresUrlError as exc:
            raise fail(str(exc)) from None
    elif inline_password or reader:
        raise fail("--inline-password and --reader go with --postgresql") from None
    if plugins is None:
        plugins = DEBIAN_PLUGINS + (DEBIAN_PG_PLUGINS if pg_section else [])
    settings = get_settings()
    ep = resolve_endpoints(settings)
    password = orthanc_password(settings, ep)
    if not password:
        raise fail(
            "set NEUROSANDBOX_ORTHANC_PASSWORD_FILE (or NEUROSANDBOX_ORTHANC_PASSWORD)"
        ) from None
    config = render_config(
        name="NeuroSandbox",
        storage_dir=storage,
        index_dir=storage,
        http_port=settings.orthanc_http_port or 8042,
        dicom_port=ep.orthanc_dicom_port,
        aet=ep.orthanc_aet,
        username=ep.username,
        password=password,
        remote_access_allowed=remote_access,
        stable_age=settings.orthanc_stable_age,
        plugins=plugins,
        gateway_aet=ep.gateway_aet,
        gateway_host=gateway_host,
        gateway_port=ep.gateway_dicom_port,
        check_modality_host=True,
        postgresql=pg_section,
        save_jobs=not reader,
    )
    write_secret(out, json.dumps(config, indent=2))
    console.print(f"wrote {escape(str(out))}")
