"""Erasure: ``neurosandbox purge`` leaves nothing of a patient in the data folder, and nothing
of the sandbox's own objects in the PACS, while the other patient's run still opens and reads.

Real parts: the in-process gateway (its DICOM node, pipeline, engine, report bundles and SR/PDF
write-back) on the session Orthanc, dcmtk's storescu as the sender, the review log on disk, a
suite run's SQLite store. The check is a byte search of every file (SQLite included) for the
identifiers planted in the purged patient's study, record and review comment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import SynthStudy, make_study
from orthanc_fixture import OrthancServer
from typer.testing import CliRunner

from evaluation import Case, Provenance
from evaluation.log import RunStore
from evaluation.review import Action, ReviewEvent, ReviewStore
from gateway.audit import AuditLog
from gateway.cli import app
from gateway.orthanc import OrthancClient, OrthancError
from gateway.purge import Places, PurgeError, Purger, PurgeTarget
from gateway.runs import RunRecord, RunStatus, StudyRunStore
from gateway.sr import series_uid_for
from gateway.study_key import orthanc_id

pytestmark = pytest.mark.integration
QUIET = 1.0
# planted identifiers of the patient to purge (none is a substring of the other's)
A_ID, A_FAMILY, A_GIVEN = "NSBX-ERASE-7Q2Z", "Quillfeather", "Ottoline"
A_COMMENT = "call the daughter Wilhelmina-Xantippe about the scan"
B_ID, B_COMMENT = "NSBX-KEEP-4M8K", "second reader agrees with B"


def _leftovers(root: Path, needles: list[str]) -> dict[str, list[str]]:
    """Every file under ``root`` (bytes, SQLite and its WAL included) holding a needle."""
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file():
            blob = path.read_bytes().lower()
            hits = [n for n in needles if n.lower().encode() in blob]
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _sandbox_series(orthanc_server: OrthancServer, gw_orthanc: object, s: SynthStudy) -> int:
    """Instances in the sandbox's SR/PDF series of this study in Orthanc."""
    n = 0
    for kind in ("sr", "pdf"):
        sid = orthanc_id(s.patient_id, s.study_uid, series_uid_for(s.study_uid, kind))
        with contextlib.suppress(OrthancError):  # 404: none of this kind
            n += len(gw_orthanc.series_instances(sid))  # type: ignore[attr-defined]
    return n


def _suite_run(folder: Path, a: SynthStudy, b: SynthStudy) -> None:
    """A suite run (``neurosandbox eval`` of registered cases) holding both patients' cases."""
    with RunStore(folder, create=True) as store:
        store.record_cases(
            [
                Case(
                    case_id="case-a",
                    patient_id=A_ID,
                    note=f"{A_GIVEN} {A_FAMILY} fell at home",
                    provenance=Provenance(source="folder", study_uids=[a.study_uid]),
                ),
                Case(
                    case_id="case-b",
                    patient_id=B_ID,
                    note="headache for two days",
                    provenance=Provenance(source="folder", study_uids=[b.study_uid]),
                ),
            ]
        )


@pytest.fixture(scope="module")
def two_patients(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Two patients' studies through the gateway (each evaluated, SR and PDF written back),
    a review comment on each run, a copy of A's instance in the cache and in quarantine, and
    a suite run with a case of each."""
    tmp = tmp_path_factory.mktemp("purge")
    a = make_study(tmp / "a", classes=("FLAIR",), n_slices=4, patient_id=A_ID,
                   patient_name=f"{A_FAMILY}^{A_GIVEN}")  # fmt: skip
    b = make_study(tmp / "b", classes=("FLAIR",), n_slices=4, patient_id=B_ID,
                   patient_name="Keeper^Bob")  # fmt: skip
    data = tmp / "data"
    gw = start_gateway(orthanc_server, data, rules_file(tmp / "r.yaml", ["differential"]), QUIET)
    try:
        send(gw.scp.port, a.files)
        send(gw.scp.port, b.files)
        runs = finished_runs(gw, 2)
    finally:
        gw.stop()
    assert all(r.status is RunStatus.DONE for r in runs), runs
    by_uid = {r.study_uid: r for r in runs}
    run_a, run_b = by_uid[a.study_uid], by_uid[b.study_uid]
    reviews = ReviewStore(data / "reviews.sqlite")
    for run, text in ((run_a, A_COMMENT), (run_b, B_COMMENT)):
        case_id = f"study-{run.study_uid[-16:]}"  # type: ignore[index]
        ev = ReviewEvent(reviewer="tok-1", run_id=run.run_id, case_id=case_id,
                         action=Action.COMMENT, text=text)  # fmt: skip
        reviews.append(ev)
    for place in ("cache/ab/x.y.dcm", "spool/quarantine/20240101T000000-q/s/1.dcm"):
        (data / place).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(a.files[0], data / place)
    _suite_run(tmp / "suite" / "run-1", a, b)
    env = {
        "NEUROSANDBOX_DATA_DIR": str(data),
        "NEUROSANDBOX_ORTHANC_URL": orthanc_server.endpoints.orthanc_url,
        "NEUROSANDBOX_ORTHANC_PASSWORD_FILE": str(orthanc_server.endpoints.password_file),
        "NEUROSANDBOX_RUNS_DIR": str(tmp / "suite"),
    }
    client = OrthancClient.from_settings(
        orthanc_server.settings.model_copy(
            update={
                "orthanc_url": orthanc_server.endpoints.orthanc_url,
                "orthanc_password_file": Path(orthanc_server.endpoints.password_file or ""),
            }
        )
    )
    try:
        yield a, b, run_a, run_b, data, env, client
    finally:
        client.close()


def _needles(a: SynthStudy) -> list[str]:
    sops = [os.path.basename(p) for p in a.files]
    return [
        A_ID,
        A_FAMILY,
        A_GIVEN,
        a.study_uid,
        "Wilhelmina-Xantippe",
        *a.series_uids.values(),
    ] + [s for s in sops if s.startswith("1.")]


def test_a_dry_run_counts_every_place_and_removes_nothing(two_patients) -> None:  # type: ignore[no-untyped-def]
    a, _, run_a, _, data, env, _ = two_patients
    before = _tree(data)
    r = CliRunner().invoke(app, ["purge", "--patient", A_ID, "--dry-run", "--json"], env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    c = out["counts"]
    assert out["run_ids"] == [run_a.run_id]
    assert c["runs"] == 1 and c["report_bundles"] == 1 and c["spool_studies"] == 1
    assert c["study_states"] == 1 and c["cache_files"] == 1 and c["spool_files"] == 1
    assert c["review_events"] == 1 and c["suite_cases"] == 1 and c["files"] > 10
    after = _tree(data)
    # nothing removed or changed (the review log's WAL may be checkpointed by reading it)
    assert set(before) <= set(after)
    assert {k: v for k, v in after.items() if k in before and "reviews" not in k} == {
        k: v for k, v in before.items() if "reviews" not in k
    }
    assert len(ReviewStore(data / "reviews.sqlite").events()) == 2
    assert A_ID not in r.stdout and a.study_uid not in r.stdout


def test_purging_a_patient_leaves_nothing_of_them_and_the_other_run_reads(
    two_patients,  # type: ignore[no-untyped-def]
    orthanc_server: OrthancServer,
) -> None:
    a, b, _, run_b, data, env, orthanc = two_patients
    suite = Path(env["NEUROSANDBOX_RUNS_DIR"])
    assert _leftovers(data, _needles(a)), "the planted identifiers were not planted"
    assert _sandbox_series(orthanc_server, orthanc, a) == 2
    hospital = orthanc.find_study_of(a.study_uid, A_ID)
    n_hospital = len(orthanc.study_instances(hospital))

    r = CliRunner().invoke(app, ["purge", "--patient", A_ID, "--pacs", "--json"], env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["counts"]["pacs_objects"] == 2 and out["counts"]["runs"] == 1

    # nothing of A in any file of the data folder or the suite run, SQLite bytes included
    assert _leftovers(data, _needles(a)) == {}
    assert _leftovers(suite, _needles(a)) == {}
    # the folders named by A's study are gone too
    assert not [p for p in data.rglob("*") if a.study_uid in p.name]
    # the PACS: the sandbox's SR and PDF gone, the hospital's images kept
    assert _sandbox_series(orthanc_server, orthanc, a) == 0
    kept = orthanc.study_instances(hospital)
    assert len(kept) == n_hospital - 2 == len(a.files), kept

    # B: the run, its report, its review comment, its SR and its suite case are intact
    runs = StudyRunStore(data)
    assert runs.get(run_b.run_id).status is RunStatus.DONE
    assert runs.report_path(run_b.run_id, "json").is_file()
    with RunStore(runs.run_dir(run_b.run_id)) as store:
        assert store.samples() and store.cases()
    assert [e.text for e in ReviewStore(data / "reviews.sqlite").events()] == [B_COMMENT]
    assert _sandbox_series(orthanc_server, orthanc, b) == 2
    with RunStore(suite / "run-1") as store:
        assert list(store.cases()) == ["case-b"]
    assert [r.run_id for r in runs.list()] == [run_b.run_id]

    # the audit entry: who, what kind, counts, a salted hash; never the patient
    [ev] = [e for e in AuditLog(data / "audit.jsonl").tail(10) if e.action == "purge"]
    assert ev.actor.startswith("cli:") and ev.target == f"patient:{out['subject']}"
    assert ev.detail.startswith("purged 1 patient: 1 runs, 1 studies")
    assert A_ID not in ev.model_dump_json() and a.study_uid not in ev.model_dump_json()


def test_a_purge_names_one_target() -> None:
    for bad in (
        {},
        {"patient_id": "X", "study_uid": "1.2.3"},
        {"study_uid": "1.2.3/../../etc"},
        {"patient_id": "A\\B"},
        {"patient_id": ""},
        {"older_than_days": -1},
    ):
        with pytest.raises(PurgeError):
            PurgeTarget.of(**bad)
    r = CliRunner().invoke(app, ["purge", "--study", "1.2.x"])
    assert r.exit_code == 2 and "not a DICOM UID" in r.output
    # the issuer is part of the patient: another issuer is another patient
    assert (
        PurgeTarget(patient_id="X").patient_hash
        != PurgeTarget(patient_id="X", issuer="H").patient_hash
    )


def test_retention_purges_old_runs_at_start_and_keeps_recent_ones(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """``NEUROSANDBOX_RETENTION_DAYS``: the gateway purges at start what finished before the
    period (its run, report, spool study and state), and keeps what is newer."""
    old = make_study(tmp_path / "old", classes=("FLAIR",), n_slices=3, patient_id="NSBX-OLD-1")
    new = make_study(tmp_path / "new", classes=("FLAIR",), n_slices=3, patient_id="NSBX-NEW-1")
    data = tmp_path / "data"
    routing = rules_file(tmp_path / "r.yaml", ["differential"])
    gw = start_gateway(orthanc_server, data, routing, QUIET)
    try:
        send(gw.scp.port, old.files)
        send(gw.scp.port, new.files)
        runs = {r.study_uid: r for r in finished_runs(gw, 2)}
    finally:
        gw.stop()
    # the first study was received and evaluated 40 days ago
    long_ago = datetime.now(UTC) - timedelta(days=40)
    store = StudyRunStore(data)
    store.update(runs[old.study_uid].run_id, finished_at=long_ago.isoformat(timespec="seconds"))
    stamp = long_ago.timestamp()
    for p in (data / "spool" / "studies").iterdir():
        if p.name.startswith(old.study_uid):
            info = json.loads((p / ".received.json").read_text())
            info["last_received"] = stamp
            (p / ".received.json").write_text(json.dumps(info))
    for p in (data / "state" / "studies").glob("*.json"):
        if old.study_uid in p.read_text():
            os.utime(p, (stamp, stamp))

    gw = start_gateway(orthanc_server, data, routing, QUIET, retention_days=30)
    try:
        assert gw.retention is not None
        deadline = datetime.now(UTC) + timedelta(seconds=20)
        while datetime.now(UTC) < deadline and len(StudyRunStore(data).list()) > 1:
            time.sleep(0.1)
    finally:
        gw.stop()
    left: list[RunRecord] = StudyRunStore(data).list()
    assert [r.study_uid for r in left] == [new.study_uid]
    assert _leftovers(data, ["NSBX-OLD-1", old.study_uid]) == {}
    assert _leftovers(data, ["NSBX-NEW-1"])  # the recent study's data stays
    events = [e for e in AuditLog(data / "audit.jsonl").tail(20) if e.action == "purge"]
    assert events and events[0].actor == "system:retention"
    assert events[0].detail.startswith("purged data older than 30 days: 1 runs, 1 studies")


def test_purge_by_study_and_older_than_by_hand(tmp_path: Path) -> None:
    """``--study``: every place keyed by the UID, whichever patient; ``--older-than`` does what
    retention does (here on a state file alone, no gateway needed)."""
    runs = StudyRunStore(tmp_path)
    from gateway.runs import StudyState
    from gateway.study_key import StudyKey

    keys = [StudyKey(study_uid="1.2.3.4.5", patient_id=p) for p in ("P1", "P2")]
    for k in keys:
        runs.save_study_state(StudyState(study_uid=k.study_uid, key=k.name))
    other = StudyKey(study_uid="1.2.3.4.6", patient_id="P1")
    runs.save_study_state(StudyState(study_uid=other.study_uid, key=other.name))
    purger = Purger(Places(data_dir=tmp_path))
    rep = purger.purge(PurgeTarget(study_uid="1.2.3.4.5"))
    assert rep.counts.study_states == 2 and rep.counts.studies == 2
    assert [p.read_text().count("1.2.3.4.6") for p in runs.state_dir.glob("*.json")] == [2]
    later = datetime.now(UTC) + timedelta(days=10)
    assert purger.purge(PurgeTarget(older_than_days=5), now=later).counts.study_states == 1
    assert not list(runs.state_dir.glob("*.json"))


def test_a_forwarder_journal_moved_to_quarantine_is_purged_too(tmp_path: Path) -> None:
    """A staging folder left by an interrupted association is moved to ``spool/quarantine`` at
    the next start, its forwarder journal with it (lines ``<orthanc id> <study key>/<series>/<n>
    .dcm``): the purged study's lines go, another study's stay (a CI run found the journal of a
    study purged by retention in quarantine)."""
    from gateway.forward import FORWARD_JOURNAL
    from gateway.study_key import StudyKey

    gone = StudyKey(study_uid="1.2.3.4.5", patient_id="P1")
    kept = StudyKey(study_uid="1.2.3.4.6", patient_id="P2")
    folders = [tmp_path / "spool" / d / "20261128T030032-e977" for d in ("quarantine", "incoming")]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / FORWARD_JOURNAL).write_text(
            f"aaaaaaaa-1 {gone.name}/1.2.3.4.5.1/1.dcm\nbbbbbbbb-2 {kept.name}/1.2.3.4.6.1/1.dcm\n"
        )
    Purger(Places(data_dir=tmp_path)).purge(PurgeTarget(study_uid=gone.study_uid))
    for folder in folders:
        text = (folder / FORWARD_JOURNAL).read_text()
        assert gone.study_uid not in text and kept.name in text, folder
