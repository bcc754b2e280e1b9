"""Orthanc on PostgreSQL: the ``PostgreSQL`` section of an Orthanc configuration for Debian's
``orthanc-postgresql`` plugin (index and DICOM files in the database), from one URL.

Several Orthanc processes may share the database (``Lock: false``, the plugin's 4.0 rule for
more than one writer); each keeps a pool of ``IndexConnectionsCount`` connections. Stability
(``StableAge``, ``StableStudy``) is decided by each Orthanc on its own, so one Orthanc receives
the studies of an AE title and the others serve reads (deploy/SCALING.md).

The password never travels on a command line: a URL that carries one is refused. The rendered
file names it as ``${VARIABLE}``, which Orthanc replaces from its own environment when it
starts (Orthanc's configuration files read environment variables so since 1.5.0); asked for,
the value is written in clear into the 0600 file instead. The variable's name contains PACS or
ORTHANC (``dicom.credentials.PACS_CREDENTIAL_ENV``), the rule for every PACS credential here.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel

from dicom import PACS_CREDENTIAL_ENV, CredentialNameError, pacs_credential

# Where Debian's orthanc-postgresql installs its two plugins (and orthanc-dicomweb its one)
DEBIAN_PG_PLUGINS = [
    "/usr/share/orthanc/plugins/libOrthancPostgreSQLIndex.so",
    "/usr/share/orthanc/plugins/libOrthancPostgreSQLStorage.so",
]
DEFAULT_PASSWORD_ENV = "ORTHANC_POSTGRESQL_PASSWORD"
DEFAULT_INDEX_CONNECTIONS = 5
MAX_URL_CHARS = 1000
SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
# sslmode values libpq knows; the plugin has one switch, EnableSsl (verification is libpq's,
# from PGSSLROOTCERT etc. in Orthanc's environment)
SSL_MODES = {"disable": False, "allow": False, "prefer": False, "require": True,
             "verify-ca": True, "verify-full": True}  # fmt: skip
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip
# PostgreSQL identifiers (a role, a database) as an operator types them: no quoting needed
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")


class OrthancPostgresUrlError(ValueError):
    """The PostgreSQL URL (or the password's variable) given for Orthanc cannot be used."""


class OrthancPostgres(BaseModel):
    """Where Orthanc's index and files live: a PostgreSQL server, database and role."""

    host: str
    port: int = 5432
    database: str
    username: str
    ssl: bool = False


def parse_postgresql_url(url: str) -> OrthancPostgres:
    """``postgresql://USER@HOST[:PORT]/DATABASE[?sslmode=...]``, checked part by part.

    Refused: a password in the URL (it would sit in the shell history and the process list),
    a unix-socket or multi-host URL, query parameters other than ``sslmode``, and any part
    that is not a plain host name/IP, port or identifier.
    """
    if not isinstance(url, str) or not url.strip():
        raise OrthancPostgresUrlError("give the PostgreSQL URL: postgresql://USER@HOST:PORT/DB")
    if len(url) > MAX_URL_CHARS:
        raise OrthancPostgresUrlError(f"the PostgreSQL URL is over {MAX_URL_CHARS} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise OrthancPostgresUrlError("the PostgreSQL URL holds spaces or control characters")
    shown = _redacted(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise OrthancPostgresUrlError(f"{shown}: {exc}") from None
    if parts.scheme.lower() not in SCHEMES:
        raise OrthancPostgresUrlError(
            f"{shown}: the scheme must be one of {', '.join(SCHEMES)}, not {parts.scheme!r}"
        )
    if parts.password is not None:
        raise OrthancPostgresUrlError(
            "the PostgreSQL URL holds a password: a command line is seen in the process list "
            f"and the shell history; leave it out and set it in {DEFAULT_PASSWORD_ENV} "
            "(or the variable --password-env names)"
        )
    if parts.fragment:
        raise OrthancPostgresUrlError(f"{shown}: a PostgreSQL URL has no #fragment")
    host = unquote(parts.hostname or "")
    if not host:
        raise OrthancPostgresUrlError(
            f"{shown}: name the server (postgresql://USER@HOST:PORT/DB); unix sockets are not "
            "supported for Orthanc's plugin here"
        )
    if "," in (parts.netloc.rsplit("@", 1)[-1]):
        raise OrthancPostgresUrlError(f"{shown}: one host only (the plugin takes one server)")
    if not _is_ip(host) and not _HOSTNAME.fullmatch(host):
        raise OrthancPostgresUrlError(f"{shown}: {host[:80]!r} is not a host name or IP address")
    if port is None:
        port = 5432
    elif not 1 <= port <= 65535:
        raise OrthancPostgresUrlError(f"{shown}: port {port} is not 1-65535")
    username = unquote(parts.username or "")
    database = unquote(parts.path.removeprefix("/"))
    for what, value in (("role (USER@)", username), ("database (/DB)", database)):
        if not value:
            raise OrthancPostgresUrlError(f"{shown}: the URL names no {what}")
        if not _NAME.fullmatch(value):
            raise OrthancPostgresUrlError(
                f"{shown}: {what} {value[:80]!r}: use up to 63 letters, digits, _ . -, "
                "not a digit first"
            )
    ssl = False
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, max_num_fields=8)
    except ValueError:
        raise OrthancPostgresUrlError(f"{shown}: too many query parameters") from None
    for key, value in query:
        if key != "sslmode":
            raise OrthancPostgresUrlError(
                f"{shown}: query parameter {key[:40]!r} is not supported (only sslmode)"
            )
        if value not in SSL_MODES:
            raise OrthancPostgresUrlError(
                f"{shown}: sslmode {value[:40]!r} is not one of {', '.join(SSL_MODES)}"
            )
        ssl = SSL_MODES[value]
    return OrthancPostgres(host=host, port=port, database=database, username=username, ssl=ssl)


def check_password_env(name: str) -> str:
    """The password variable's name, checked by the rule for PACS credentials."""
    if not re.fullmatch(PACS_CREDENTIAL_ENV, name or ""):
        raise OrthancPostgresUrlError(
            f"--password-env {name[:80]!r}: the variable's name must be upper-case letters, "
            "digits and _ and contain PACS or ORTHANC (e.g. ORTHANC_POSTGRESQL_PASSWORD)"
        )
    return name


def postgresql_section(
    target: OrthancPostgres,
    *,
    password_env: str = DEFAULT_PASSWORD_ENV,
    inline_password: bool = False,
    index_connections: int = DEFAULT_INDEX_CONNECTIONS,
) -> dict[str, Any]:
    """The ``PostgreSQL`` section: index and storage on, ``Lock`` off, a connection pool.

    The password is ``${password_env}`` for Orthanc to read at start, or, with
    ``inline_password``, the variable's value read now (an unset variable is an error).
    """
    check_password_env(password_env)
    if not 2 <= index_connections <= 100:
        raise OrthancPostgresUrlError(
            f"--index-connections {index_connections}: use 2-100 (one connection serialises "
            "every request of the Orthanc)"
        )
    password = "${" + password_env + "}"
    if inline_password:
        try:
            value = pacs_credential(password_env)
        except CredentialNameError as exc:
            raise OrthancPostgresUrlError(str(exc)) from None
        if value is None:
            raise OrthancPostgresUrlError(
                f"--inline-password: {password_env} is not set; set it to the role's password"
            )
        password = value
    return {
        "EnableIndex": True,
        "EnableStorage": True,
        "Host": target.host,
        "Port": target.port,
        "Database": target.database,
        "Username": target.username,
        "Password": password,
        "EnableSsl": target.ssl,
        "Lock": False,  # several Orthancs share the database (one receives, others read)
        "IndexConnectionsCount": index_connections,
        "MaximumConnectionRetries": 10,  # a PostgreSQL restart: retry for a minute
        "ConnectionRetryInterval": 5,
    }


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _redacted(url: str) -> str:
    """The URL for an error message: bounded, any password replaced."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)[:200]
