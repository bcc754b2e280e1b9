"""A registered case that names several studies is evaluated once, on every study it names.

A stroke case names a head CT and the MR that followed; evaluated study by study, each run saw
half the case and the leaderboard kept one of them. The DICOM node completes each study on its
own; ``CaseGatherer`` holds the studies of a case of several studies until every study the case
names has arrived (in the spool, under the same patient), or until ``wait_s`` seconds after the
first, and then hands them over together (``CaseStudies``): one run of the case, on all of
them, saying which named study did not arrive. The studies' patient is checked as for any study
(the pipeline's identity check, on their one index): a case whose studies name two patients is
held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.datasets import case_registry
from gateway.scp import ReceivedStudy, uid_key
from gateway.spool import read_received_info
from gateway.study_key import StudyKey

log = logging.getLogger(__name__)

DEFAULT_WAIT_S = 600.0


@dataclass
class CaseStudies:
    """The studies of one case, handed over together."""

    case_id: str
    primary: ReceivedStudy  # the first named study that arrived: the run's, the SR's
    others: list[ReceivedStudy] = field(default_factory=list)  # the other named studies
    missing: list[str] = field(default_factory=list)  # named StudyInstanceUIDs not arrived
    # a named study that arrived for another patient ("<UID>: ID <patient>"): the case is held
    other_patients: list[str] = field(default_factory=list)
    wait_s: float = DEFAULT_WAIT_S


@dataclass
class _Waiting:
    timer: threading.Timer
    first: float = field(default_factory=time.monotonic)


class CaseGatherer:
    """Collects the studies of registered cases that name more than one study."""

    def __init__(
        self,
        cases: Path | None,
        spool: Path | None,
        submit: Callable[[CaseStudies], object],
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.cases, self.spool, self.submit, self.wait_s = cases, spool, submit, wait_s
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}
        # (case, patient) -> the studies it was last handed over with
        self._last: dict[str, tuple[object, ...]] = {}

    def offer(self, study: ReceivedStudy) -> bool:
        """Take a completed study that belongs to a case of several studies (True), else
        leave it to the caller (False: no such case, or another patient's study, which the
        pipeline's identity check holds)."""
        if self.cases is None or self.spool is None:
            return False
        try:
            registered, _problems = case_registry(self.cases)
        except Exception:  # an unreadable registry: the study goes on alone, the run says why
            return False
        case = registered.get(study.study_uid)
        if case is None or len(case.provenance.study_uids) < 2:
            return False
        if not case.is_of_patient(study.key.patient_id):
            return False
        self._gather(case.case_id, list(case.provenance.study_uids), study, final=False)
        return True

    def _arrived(self, named: list[str], study: ReceivedStudy) -> dict[str, ReceivedStudy]:
        """The named studies in the spool under this study's patient (this one included)."""
        out: dict[str, ReceivedStudy] = {study.study_uid: study}
        assert self.spool is not None
        for uid in named:
            if uid in out:
                continue
            key = StudyKey(study_uid=uid, patient_id=study.key.patient_id, issuer=study.key.issuer)
            folder = self.spool / key.name
            n = sum(1 for _ in folder.rglob("*.dcm")) if folder.is_dir() else 0
            if n:
                info = read_received_info(folder)
                out[uid] = ReceivedStudy(
                    study_uid=uid,
                    key=key,
                    folder=str(folder),
                    calling_aets=list(info.get("calling_aets", [])),
                    n_instances=n,
                    n_new=0,
                    first_received=float(info.get("first_received", 0.0) or 0.0),
                    last_received=float(info.get("last_received", 0.0) or 0.0),
                )
        return out

    def _gather(self, case_id: str, named: list[str], study: ReceivedStudy, final: bool) -> None:
        arrived = self._arrived(named, study)
        missing = [u for u in named if u not in arrived]
        others = self._other_patients(named, study)
        ident = f"{case_id}\\{study.key.patient_hash}"  # a case's studies of one patient
        with self._lock:
            if missing and not final:
                if ident not in self._waiting:
                    timer = threading.Timer(
                        self.wait_s, self._gather, (case_id, named, study, True)
                    )
                    timer.daemon = True
                    self._waiting[ident] = _Waiting(timer)
                    timer.start()
                    log.info(
                        "case %s: %d of %d studies arrived; waiting up to %.0f s for the rest",
                        uid_key(case_id),
                        len(arrived),
                        len(named),
                        self.wait_s,
                    )
                return
            waiting = self._waiting.pop(ident, None)
            if waiting is not None and not final:
                waiting.timer.cancel()
            # the same studies as last handed over (their siblings completing in the same
            # tick): once is enough
            seen = (
                tuple(sorted((s.key.name, s.n_instances) for s in arrived.values())),
                tuple(sorted(sop for s in arrived.values() for sop in s.revised)),
            )
            if self._last.get(ident) == seen:
                return
            self._last[ident] = seen
        ordered = [arrived[u] for u in named if u in arrived]
        self.submit(
            CaseStudies(
                case_id=case_id,
                primary=ordered[0],
                others=ordered[1:],
                missing=missing,
                other_patients=others,
                wait_s=self.wait_s,
            )
        )

    def _other_patients(self, named: list[str], study: ReceivedStudy) -> list[str]:
        """Named studies in the spool under another patient than this study's."""
        assert self.spool is not None
        out = []
        for uid in named:
            for folder in sorted(self.spool.glob(f"{uid}_*")):
                parsed = StudyKey.parse_name(folder.name)
                if parsed is None or parsed[1] == study.key.patient_hash:
                    continue
                pid = str(read_received_info(folder).get("patient_id", ""))
                out.append(f"study {uid}: ID {pid or '(none)'}")
        return out

    def close(self) -> None:
        with self._lock:
            for w in self._waiting.values():
                w.timer.cancel()
            self._waiting.clear()
