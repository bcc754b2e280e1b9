"""One settings object for the whole service: environment variables prefixed NEUROSANDBOX_."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from dicom.headers import DEFAULT_MEMORY_CAP


class Settings(BaseSettings):
    """Configuration; every field can be set as NEUROSANDBOX_<FIELD> (e.g. NEUROSANDBOX_MEMORY_CAP)."""

    model_config = SettingsConfigDict(env_prefix="NEUROSANDBOX_", env_file=".env", extra="ignore")

    memory_cap: int = DEFAULT_MEMORY_CAP  # bytes one decoded image or volume may need
    workers: int | None = None  # header-reading processes; default: up to 4, by CPU count
    corpus: Path = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dicom"
    out: Path = Path("out")


def get_settings() -> Settings:
    return Settings()
