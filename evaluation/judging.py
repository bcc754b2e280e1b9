"""The optional LLM equivalence judge over a finished run: ``neurosandbox runs judge``.

The lexicon decides most diagnosis strings; the pairs it cannot decide (an answer it does not
know, against the case's true diagnosis) are put to a judge model once each, and the verdicts go
to ``RUNDIR/judge.json``. Rescoring reads that file, so judge matches count as matches,
flagged and reported apart (``judge_matches`` in the summary), and scores stay recomputable from
the run folder alone. A judge that fails on a pair leaves it undecided (asked again next time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from evaluation.answers import Answer
from evaluation.models import ModelSpec, create_model
from evaluation.phi import PHIGate, is_trusted, scrub_text

JUDGE_FILE = "judge.json"


class JudgeSummary(BaseModel):
    pairs: int  # distinct (answer, truth) pairs the lexicon could not decide
    asked: int  # of which put to the judge now (the others were already in judge.json)
    equivalent: int
    not_equivalent: int
    unreadable: int  # the judge answered but not in the schema, or the call failed
    withheld: int  # pairs holding the patient's identifiers, not sent to an untrusted judge
    cache: str


def judge_file(run_dir: Path) -> Path:
    return Path(run_dir) / JUDGE_FILE


async def judge_run(
    run_dir: Path,
    spec: ModelSpec,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    database_url: str | None = None,
) -> JudgeSummary:
    """Ask ``spec`` about every undecided diagnosis pair of the run; store the verdicts."""
    from evaluation.engine import load_config, open_dataset
    from evaluation.log.store import open_store
    from evaluation.scoring.judge import EquivalenceJudge, unknown_pairs
    from evaluation.scoring.judge_cache import JudgeCache, JudgeVerdict

    config, _ = load_config(run_dir, database_url)
    dataset = open_dataset(config, cache_dir)
    cases = {c.case_id: c for c in dataset.cases}
    store = open_store(run_dir, database_url=database_url, read_only=True)
    try:
        rows = store.samples(calls=False, scores=False)
    finally:
        store.close()
    # A judge off the trusted hosts never sees a string that carries the patient's identifiers
    # (a model may echo a name into its diagnosis): such a pair is withheld, not scrubbed, since
    # the verdict must be keyed by the string as the model wrote it.
    trusted = is_trusted(spec.api_base, config.phi, local=spec.is_local)
    gate = PHIGate(config.phi)
    pairs: list[tuple[str, str]] = []
    withheld: set[tuple[str, str]] = set()
    for row in rows:
        case = cases.get(row.case_id)
        if case is None or not isinstance(row.parsed, Answer):
            continue  # classification answers and unparsed replies have no diagnosis strings
        for pair in unknown_pairs(case, row.parsed):
            if not trusted and scrub_text(pair[0], gate.terms_for(case))[1]:
                withheld.add(pair)
            else:
                pairs.append(pair)
    unique = [p for p in dict.fromkeys(pairs) if p not in withheld]
    cache = JudgeCache(judge_file(run_dir))
    todo = [p for p in unique if cache.get(*p) is None]
    adapter = create_model(spec)
    judge = EquivalenceJudge(adapter, cache, concurrency=spec.concurrency)
    done = 0

    async def one(answer: str, truth: str) -> JudgeVerdict:
        nonlocal done
        verdict = await judge.judge(answer, truth)  # bounded by the judge's own semaphore
        done += 1
        if progress:
            progress(done, len(todo))
        return verdict

    try:
        verdicts = await asyncio.gather(*(one(a, t) for a, t in todo))
    finally:
        close = getattr(adapter, "close", None)
        if callable(close):
            close()
    return JudgeSummary(
        pairs=len(unique),
        asked=len(todo),
        equivalent=sum(v.equivalent is True for v in verdicts),
        not_equivalent=sum(v.equivalent is False for v in verdicts),
        unreadable=sum(v.equivalent is None for v in verdicts),
        withheld=len(withheld),
        cache=str(cache.path),
    )
