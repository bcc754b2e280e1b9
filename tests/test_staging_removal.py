"""A committed association's staging folder goes, even when the forwarder's journal line for
its last instance lands while the folder is being removed (the line is appended from the
forwarder's thread by the folder's path). A fresh-clone CI run found such a folder left in
``spool/incoming`` with the study's key in its journal, quarantined at the next start."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gateway import scp
from gateway.forward import FORWARD_JOURNAL


def _rmtree_with_a_late_journal_line(staging: Path, real=shutil.rmtree):  # type: ignore[no-untyped-def]
    """rmtree as it runs: it lists and deletes the files, and between that and the folder's
    own rmdir the forwarder's callback appends its line to ``staging/.forwarded``."""

    def rmtree(path: str | os.PathLike[str], ignore_errors: bool = False) -> None:
        for child in Path(path).iterdir():
            child.unlink()
        # the forwarder's _journal: O_CREAT|O_APPEND by the staging folder's (old) path
        try:
            fd = os.open(staging / FORWARD_JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            pass  # no folder there any more: the line is dropped
        else:
            os.write(fd, b"aaaaaaaa-1 1.2.3_key/1.2.3.1/1.dcm\n")
            os.close(fd)
        try:
            os.rmdir(path)
        except OSError:
            if not ignore_errors:
                raise

    return rmtree


def test_a_journal_line_landing_during_removal_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = tmp_path / "incoming"
    staging = incoming / "0123456789abcdef"
    staging.mkdir(parents=True)
    (staging / FORWARD_JOURNAL).write_text("bbbbbbbb-2 1.2.3_key/1.2.3.1/0.dcm\n")
    monkeypatch.setattr(scp.shutil, "rmtree", _rmtree_with_a_late_journal_line(staging))
    scp.remove_committed_staging(staging)
    assert list(incoming.iterdir()) == []


def test_a_removal_cut_short_is_finished_at_the_next_start(tmp_path: Path) -> None:
    """A crash between the rename and the removal: the next start removes the committed
    folder (its files were placed; nothing of it is undone or quarantined)."""
    node = scp.StorageSCP(tmp_path / "spool", port=0)
    left = node.incoming / f"0123456789abcdef{scp.COMMITTED_SUFFIX}"
    left.mkdir(parents=True)
    (left / FORWARD_JOURNAL).write_text("aaaaaaaa-1 1.2.3_key/1.2.3.1/1.dcm\n")
    (node.studies_dir).mkdir(parents=True, exist_ok=True)
    (node.quarantine).mkdir(parents=True, exist_ok=True)
    node._recover()
    assert not left.exists()
    assert list(node.quarantine.iterdir()) == []
