"""What the API's routers share: settings, the Orthanc client, stores and the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.audit import AuditLog
from gateway.auth import TokenStore, tokens_file
from gateway.orthanc import OrthancClient
from gateway.pipeline import StudyPipeline
from gateway.runs import StudyRunStore
from gateway.scp import StorageSCP
from gateway.settings import Settings
from gateway.viewer_pacs import StudyOwners


@dataclass
class GatewayContext:
    settings: Settings
    orthanc: OrthancClient
    runs: StudyRunStore
    audit: AuditLog
    tokens: TokenStore
    pipeline: StudyPipeline | None = None  # None: the API can read but not start evaluations
    scp: StorageSCP | None = None  # the DICOM node: STOW-RS stores through it (None: 503)
    # how many patients hold a study UID the viewer reads (remembered briefly)
    study_owners: StudyOwners = field(default_factory=StudyOwners)

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewayContext:
        data = settings.data_dir
        return cls(
            settings=settings,
            orthanc=OrthancClient.from_settings(settings),
            runs=StudyRunStore.from_settings(settings),
            audit=AuditLog.from_settings(settings),
            tokens=TokenStore(tokens_file(data)),
        )
