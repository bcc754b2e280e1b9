"""The PACS the sandbox talks to, configured by name in one YAML file (``NEUROSANDBOX_PACS_FILE``).

Three kinds, each with what the standard needs to reach it::

    pacs:
      archive:                     # any DIMSE archive (C-FIND; C-GET, or C-MOVE to us)
        kind: dimse
        ae_title: ARCHIVE
        host: pacs.hospital.local
        port: 11112
        calling_ae: NEUROSANDBOX   # our AE title as the archive knows it
        retrieve: c-move           # or c-get
        move_destination: NEUROSANDBOX  # the AE the archive sends C-MOVE results to; it must
        receive_port: 11113        # know that AE at this machine's address and this port
        tls: {ca_file: /etc/ssl/hospital-ca.pem}
      web:                         # DICOMweb: QIDO-RS, WADO-RS, STOW-RS
        kind: dicomweb
        url: https://pacs.hospital.local/dicom-web   # or qido_url / wado_url / stow_url
        username_env: HOSPITAL_PACS_USER
        password_env: HOSPITAL_PACS_PASSWORD
        tls: {ca_file: /etc/ssl/hospital-ca.pem}
      research:                    # an Orthanc by its REST API, as the sandbox always did
        kind: orthanc
        url: http://orthanc.local:8042
    writeback: archive             # where SR and PDF go; default: the local Orthanc

Credentials are never in the file nor on the command line: the file names the environment
variables that hold them, and those names must contain PACS or ORTHANC (``dicom``'s one rule).
``local`` is always there: the sandbox's own Orthanc from the settings (``neurosandbox pacs
up``), unless the file names another PACS ``local``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dicom import PACS_CREDENTIAL_ENV

LOCAL = "local"  # the sandbox's own Orthanc
MAX_FILE_BYTES = 256 * 1024
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# an AE title: 1-16 characters of the default repertoire, no backslash or control characters
_AE = r"^[ -\[\]-~]{0,15}[!-\[\]-~][ -\[\]-~]{0,15}$"
_HTTP_URL = r"^https?://[^\s]{1,2000}$"
EnvName = Annotated[str, Field(pattern=PACS_CREDENTIAL_ENV, max_length=128)]
AETitle = Annotated[str, Field(pattern=_AE, max_length=16)]
HttpUrl = Annotated[str, Field(pattern=_HTTP_URL)]


class PacsConfigError(ValueError):
    """The PACS file, or a name looked up in it, is wrong; the message says where."""


class TlsConfig(BaseModel):
    """TLS to a PACS: the hospital's CA (verification is always on) and, where the PACS asks
    for one, this node's certificate and key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(
        default=None, description="PEM file of the CA(s) that sign the PACS's certificate"
    )
    cert_file: Path | None = Field(default=None, description="our certificate (PEM), if asked")
    key_file: Path | None = Field(default=None, description="its private key (PEM, 0600)")
    server_name: str | None = Field(
        default=None, max_length=253, description="the name the certificate must carry"
    )

    @model_validator(mode="after")
    def _key_with_cert(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (or neither)")
        return self


class _Pacs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(default=120.0, gt=0, le=3600, description="per network call")
    tls: TlsConfig | None = Field(default=None, description="TLS settings; https URLs use it")


class OrthancPacs(_Pacs):
    """An Orthanc, by its REST API."""

    kind: Literal["orthanc"]
    url: HttpUrl
    username: str | None = Field(default=None, max_length=128)
    username_env: EnvName | None = None
    password_env: EnvName | None = None


class DicomwebPacs(_Pacs):
    """A DICOMweb server: QIDO-RS to find, WADO-RS to pull, STOW-RS to store."""

    kind: Literal["dicomweb"]
    url: HttpUrl | None = Field(default=None, description="the base of all three services")
    qido_url: HttpUrl | None = None
    wado_url: HttpUrl | None = None
    stow_url: HttpUrl | None = None
    username_env: EnvName | None = None
    password_env: EnvName | None = None
    token_env: EnvName | None = Field(
        default=None, description="a bearer token's variable (instead of user and password)"
    )

    def service(self, which: Literal["qido", "wado", "stow"]) -> str:
        """The base URL of one service (its own URL, else ``url``), without a trailing /."""
        own = {"qido": self.qido_url, "wado": self.wado_url, "stow": self.stow_url}[which]
        base = own or self.url
        if not base:
            raise PacsConfigError(f"no {which}_url and no url for this DICOMweb PACS")
        return base.rstrip("/")


class DimsePacs(_Pacs):
    """A DICOM node: C-FIND to find; C-GET, or C-MOVE to us, to pull; C-STORE to store."""

    kind: Literal["dimse"]
    ae_title: AETitle
    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)
    calling_ae: AETitle = "NEUROSANDBOX"
    retrieve: Literal["c-get", "c-move"] = "c-get"
    move_destination: AETitle | None = Field(
        default=None, description="the AE title C-MOVE sends to (default: calling_ae)"
    )
    receive_host: str = Field(default="0.0.0.0", max_length=253)
    receive_port: int | None = Field(
        default=None, ge=1, le=65535, description="where C-MOVE's results arrive (c-move only)"
    )


PacsEntry = Annotated[OrthancPacs | DicomwebPacs | DimsePacs, Field(discriminator="kind")]


class PacsFile(BaseModel):
    """The whole file: the PACS by name, and where write-back goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pacs: dict[Annotated[str, Field(pattern=_NAME)], PacsEntry] = Field(default_factory=dict)
    writeback: str | None = Field(
        default=None, pattern=_NAME, description="the PACS SR and PDF go to (default: local)"
    )


def _problems(exc: ValidationError, where: str) -> str:
    lines = []
    for e in exc.errors(include_url=False, include_input=False):
        path = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        lines.append(f"{where}: {path or '(top)'}: {e['msg']}")
    return "\n".join(lines[:20])


def load_pacs_file(path: Path) -> PacsFile:
    """The checked PACS file; PacsConfigError naming every wrong field by its path."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise PacsConfigError(f"{path}: over {MAX_FILE_BYTES} bytes; is it the PACS file?")
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise PacsConfigError(f"{path}: cannot read the PACS file: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PacsConfigError(f"{path}: not YAML: {str(exc)[:300]}") from None
    if not isinstance(data, dict):
        raise PacsConfigError(f"{path}: must be a mapping with 'pacs:' (and 'writeback:')")
    try:
        checked = PacsFile.model_validate(data)
    except ValidationError as exc:
        raise PacsConfigError(_problems(exc, str(path))) from None
    if checked.writeback and checked.writeback != LOCAL and checked.writeback not in checked.pacs:
        raise PacsConfigError(
            f"{path}: writeback: {checked.writeback!r} is not a PACS of this file "
            f"(known: {', '.join(known_names(checked))})"
        )
    return checked


def known_names(pacs: PacsFile) -> list[str]:
    """Every name a command may give: the file's and ``local``."""
    return sorted({LOCAL, *pacs.pacs})


def pacs_named(pacs: PacsFile, name: str, local: OrthancPacs | None) -> PacsEntry:
    """The PACS called ``name`` (``local``: the sandbox's own Orthanc, given by the caller)."""
    if name in pacs.pacs:
        return pacs.pacs[name]
    if name == LOCAL and local is not None:
        return local
    shown = re.sub(r"[^\x20-\x7e]", "?", name[:64])
    raise PacsConfigError(
        f"no PACS named {shown!r}; known: {', '.join(known_names(pacs))} "
        "(set NEUROSANDBOX_PACS_FILE to the file that names yours; see docs/gateway.md)"
    )
