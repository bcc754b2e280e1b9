"""The neuro lexicon and diagnosis matching.

A concept has a canonical name, an ICD-10 code (plus alternative codes clinicians use), synonyms
and abbreviations, a disease group and parents (glioblastoma -> high-grade glioma -> glioma ->
brain tumour). ``match_diagnosis`` compares a model's diagnosis with the ground truth and names
the level at which they agree:

    exact        the same words after normalisation (case, punctuation, spelling, plurals)
    synonym      the same concept (a synonym, abbreviation or the case's accepted synonyms)
    narrower     the answer is a more specific form of the truth (truth "glioma", answer "GBM")
    qualifier    the same disease once qualifiers (territory, mechanism, site, course) are
                 dropped (truth "left MCA territory infarct", answer "acute ischaemic stroke"
                 or "cardioembolic stroke"); where the lesion is, is scored by lesion matching
    judge        the LLM equivalence judge said equivalent (cached; reported apart)
    broader      the answer is an ancestor (truth "glioblastoma", answer "glioma"): partly right
    icd10_prefix same ICD-10 3-character category (I63.x vs I63.y): partly right
    group        same disease group only (meningioma vs glioblastoma: both tumours)
    none

The first five count as correct; the others earn partial credit and are wrong for pass@k.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, Field

from evaluation.case import Diagnosis, DiseaseGroup
from evaluation.scoring.text import clause_tokens, clean, normalise, tokens

if TYPE_CHECKING:
    from evaluation.scoring.judge_cache import JudgeCache

LEXICON_PATH = Path(__file__).with_name("data") / "neuro_lexicon.yaml"
# Negation applies to a concept, within its clause; "non-" is a prefix (text.tokens joins it to
# its word), never a negation.
_NEGATION_BEFORE = frozenset(
    {
        "no",
        "not",
        "without",
        "excluding",
        "exclude",
        "excluded",
        "negative",
        "absent",
        "absence",
        "free",
    }
)
_NEGATION_AFTER = frozenset({"unlikely", "excluded", "ruled", "absent", "negative"})
# a site or mechanism word and its other form: "haemorrhage in the thalamus" names a thalamic
# haemorrhage, "haemorrhage into a tumour" a haemorrhagic tumour (normalised spellings)
_FORMS: dict[str, str] = {
    "thalamus": "thalamic", "pons": "pontine", "cerebellum": "cerebellar", "putamen": "putaminal",
    "lobe": "lobar", "ventricle": "intraventricular", "medulla": "medullary", "cortex": "cortical",
    "hemorrhage": "hemorrhagic", "embolus": "embolic", "ischemia": "ischemic",
    "hemisphere": "hemispheric", "cerebrum": "cerebral", "spine": "spinal", "cord": "spinal",
}  # fmt: skip
_FORMS.update({v: k for k, v in list(_FORMS.items()) if v not in _FORMS})
_SITE_LINK = frozenset({"in", "of", "involving", "within", "affecting", "at"})
_SIDE = frozenset({"left", "right", "bilateral", "both"})
_INTO = frozenset({"into", "within"})
# words before a disease term that say when, how sure or how big, never which subtype
_NOT_SUBTYPE = frozenset(
    {"acute", "subacute", "hyperacute", "new", "recent", "old", "early", "late", "large", "small",
     "possible", "probable", "suspected", "likely", "presumed", "left", "right", "bilateral", "major", "minor"}
)  # fmt: skip


class LexiconError(ValueError):
    """The lexicon data file is inconsistent (unknown parent, duplicate synonym, ...)."""


class Concept(BaseModel):
    id: str
    name: str
    icd10: str
    cm: bool = False  # icd10 is an ICD-10-CM code (WHO has no specific one)
    alt_icd10: list[str] = Field(default_factory=list)
    icdo3: str | None = None
    group: DiseaseGroup
    also_groups: list[DiseaseGroup] = Field(default_factory=list)
    parents: list[str] = Field(default_factory=list)
    qualifier: bool = False
    synonyms: list[str] = Field(default_factory=list)

    @property
    def groups(self) -> set[DiseaseGroup]:
        return {self.group, *self.also_groups}

    @property
    def icd10_categories(self) -> set[str]:
        """3-character ICD-10 categories acceptable for this concept."""
        return {c[:3] for c in [self.icd10, *self.alt_icd10]}


class MatchLevel(StrEnum):
    EXACT = "exact"
    SYNONYM = "synonym"
    NARROWER = "narrower"
    QUALIFIER = "qualifier"
    JUDGE = "judge"
    BROADER = "broader"
    ICD10_PREFIX = "icd10_prefix"
    GROUP = "group"
    NONE = "none"


CREDIT: dict[MatchLevel, float] = {
    MatchLevel.EXACT: 1.0,
    MatchLevel.SYNONYM: 1.0,
    MatchLevel.NARROWER: 1.0,
    MatchLevel.QUALIFIER: 1.0,
    MatchLevel.JUDGE: 1.0,
    MatchLevel.BROADER: 0.5,
    MatchLevel.ICD10_PREFIX: 0.5,
    MatchLevel.GROUP: 0.25,
    MatchLevel.NONE: 0.0,
}


class Lookup(BaseModel):
    """Which concept a free-text diagnosis names, and how sure the reading is."""

    concept_id: str | None = None
    matched_text: str | None = None
    whole: bool = False  # the whole string is a lexicon name (not found inside a longer phrase)
    alternatives: list[str] = Field(default_factory=list)  # other unrelated concepts named
    negated: list[str] = Field(default_factory=list)  # concepts named only to be ruled out


class DiagnosisMatch(BaseModel):
    answer: str
    truth: str
    level: MatchLevel
    credit: float
    correct: bool
    answer_concept: str | None = None
    truth_concept: str | None = None
    judge: bool = False  # decided by the LLM judge, not the lexicon
    hedged: bool = False  # the answer named several unrelated diagnoses
    partial_reading: bool = False  # the lexicon knew only part of the answer or truth

    @property
    def judgeable(self) -> bool:
        """Wrong by the lexicon, which did not know the whole string: worth asking the judge."""
        return not self.correct and self.partial_reading


class Lexicon:
    """Concepts by id, with a normalised-name index for lookup."""

    def __init__(self, concepts: Iterable[Concept]) -> None:
        self.concepts: dict[str, Concept] = {}
        self._index: dict[str, str] = {}
        for c in concepts:
            if c.id in self.concepts:
                raise LexiconError(f"duplicate concept id {c.id!r}")
            self.concepts[c.id] = c
        for c in self.concepts.values():
            for p in c.parents:
                if p not in self.concepts:
                    raise LexiconError(f"{c.id}: unknown parent {p!r}")
            for text in [c.name, *c.synonyms]:
                key = normalise(text)
                other = self._index.setdefault(key, c.id)
                if other != c.id:
                    raise LexiconError(f"{text!r} names both {other!r} and {c.id!r}")
        self._max_len = max(len(k.split()) for k in self._index)
        self._words: dict[str, set[str]] = {
            c.id: {t for text in [c.name, *c.synonyms] for t in tokens(text)}
            for c in self.concepts.values()
        }
        # the proper names a concept's names start with ("Devic", "Marchiafava Bignami"): said
        # alone, an eponym names the one concept it starts
        eponyms: dict[str, set[str]] = {}
        for c in self.concepts.values():
            for text in [c.name, *c.synonyms]:
                words = clean(text).replace("-", " ").split()
                lead = 0
                while lead < len(words) - 1 and (
                    _proper(words[lead]) or (words[lead] in _PARTICLES and _proper(words[lead + 1]))
                ):
                    lead += 1
                for n in range(1, lead + 1):
                    eponyms.setdefault(normalise(" ".join(words[:n])), set()).add(c.id)
        self._eponyms = {k: v.pop() for k, v in eponyms.items() if len(v) == 1}
        self._children: dict[str, list[str]] = {}
        for c in self.concepts.values():
            for p in c.parents:
                self._children.setdefault(p, []).append(c.id)

    @classmethod
    def load(cls, path: Path = LEXICON_PATH) -> Lexicon:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return cls(Concept.model_validate(d) for d in data["concepts"])

    def __len__(self) -> int:
        return len(self.concepts)

    def __getitem__(self, concept_id: str) -> Concept:
        return self.concepts[concept_id]

    def ancestors(self, concept_id: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.concepts[concept_id].parents)
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(self.concepts[p].parents)
        return seen

    def by_icd10(self, code: str) -> list[Concept]:
        code = code.strip().upper()
        return [c for c in self.concepts.values() if c.icd10 == code]

    def lookup(self, text: str) -> Lookup:
        """The concept a diagnosis string names: the whole string, else phrases inside it."""
        toks, clause = clause_tokens(text)
        key = " ".join(toks)
        if key in self._index:
            return Lookup(concept_id=self._index[key], matched_text=key, whole=True)
        if key in self._eponyms:
            return Lookup(concept_id=self._eponyms[key], matched_text=key, whole=True)
        spans: list[tuple[int, int, str]] = []
        for n in range(min(self._max_len, len(toks)), 0, -1):
            for i in range(len(toks) - n + 1):
                if clause[i] != clause[i + n - 1]:
                    continue  # a name never spans two clauses
                cid = self._index.get(" ".join(toks[i : i + n]))
                if cid is not None:
                    spans.append((i, i + n, cid))
        # drop spans inside a longer span ("infarct" inside "cerebellar infarct")
        spans = [
            s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)
        ]
        spans = self._bleed_into(spans, toks, clause)
        spans = [self._qualified(s, toks, clause, spans) for s in spans]
        kept: list[tuple[int, int, str]] = []
        negated: list[tuple[int, int, str]] = []
        for s in spans:
            # negation is scoped to the clause: "no haemorrhage; ischaemic stroke"
            before = _in_clause(toks, clause, max(0, s[0] - 3), s[0], s[0])
            after = _in_clause(toks, clause, s[1], s[1] + 2, s[1] - 1)
            (negated if before & _NEGATION_BEFORE or after & _NEGATION_AFTER else kept).append(s)
        if not kept:
            return Lookup(negated=[s[2] for s in negated])
        ids = list(dict.fromkeys(s[2] for s in kept))
        # phrases in one lineage name the deepest concept ("acute ischaemic stroke in the MCA
        # territory"); unrelated phrases are a hedge and the first one named is taken
        deepest = [i for i in ids if not any(i in self.ancestors(j) for j in ids if j != i)]
        first = min((s for s in kept if s[2] in deepest), key=lambda s: (s[0], -(s[1] - s[0])))
        root = _unqualified(self, first[2])
        return Lookup(
            concept_id=first[2],
            matched_text=" ".join(toks[first[0] : first[1]]),
            # "MCA territory (cardioembolic)": two qualifiers of one disease are no hedge
            alternatives=[i for i in deepest if i != first[2] and not _unqualified(self, i) & root],
            negated=[s[2] for s in negated],
        )

    def _subtype(self, cid: str, words: set[str]) -> str | None:
        """The nearest descendant of ``cid`` that has one of ``words`` in a name, if only one
        at that depth has; None when none does or the nearest are several."""
        frontier, seen = [cid], {cid}
        while frontier:
            frontier = [c for p in frontier for c in self._children.get(p, []) if c not in seen]
            seen.update(frontier)
            hits = sorted({c for c in frontier if words & self._words[c]})
            if len(hits) == 1:
                return hits[0]
            if hits:
                return None  # ambiguous: keep the parent
        return None

    def _qualifier_words(self, word: str, cid: str) -> set[str]:
        """A word and its other form, unless it says when, how sure or how big, negates, or is
        a word of the concept's own names."""
        if word in _NOT_SUBTYPE or word in _NEGATION_BEFORE or word in self._words[cid]:
            return set()
        return {word} | ({_FORMS[word]} if word in _FORMS else set())

    def _qualified(
        self,
        span: tuple[int, int, str],
        toks: list[str],
        clause: list[int],
        spans: list[tuple[int, int, str]],
    ) -> tuple[int, int, str]:
        """A subtype qualifier on a parent term selects the subtype: a word just before it
        ("ischemic CVA" -> acute ischaemic stroke, "lacunar stroke" -> lacunar infarct), else a
        site after it ("haemorrhage in the left thalamus" -> deep haemorrhage). The word (or
        its other form, thalamus/thalamic) must name the nearest descendant that has it in a
        name, and only one; timing and certainty words never qualify."""
        i, j, cid = span

        def free(k: int) -> bool:
            inside = any(o[0] <= k < o[1] for o in spans)
            return 0 <= k < len(toks) and clause[k] == clause[i] and not inside

        if free(i - 1) and (words := self._qualifier_words(toks[i - 1], cid)):
            sub = self._subtype(cid, words)
            return (i - 1, j, sub) if sub else span
        k = j
        if free(k) and toks[k] in _SITE_LINK:
            k += 1
            while free(k) and toks[k] in _SIDE:
                k += 1
            if free(k) and (words := self._qualifier_words(toks[k], cid)):
                sub = self._subtype(cid, words)
                return (i, k + 1, sub) if sub else span
        return span

    def _bleed_into(
        self, spans: list[tuple[int, int, str]], toks: list[str], clause: list[int]
    ) -> list[tuple[int, int, str]]:
        """A haemorrhage into (within) a lesion is that lesion, haemorrhagic: "bleed into a
        tumour" names a haemorrhagic tumour, never a haemorrhagic stroke beside a tumour."""
        out = list(spans)
        for s in spans:
            i, j, cid = s
            if i < 2 or toks[i - 1] not in _INTO or toks[i - 2] != "hemorrhage":
                continue
            if clause[i - 2] != clause[i]:
                continue
            out = [o for o in out if o[1] != i - 1]  # the haemorrhage term itself
            sub = self._subtype(cid, {"hemorrhagic", "hemorrhage"})
            start = min([i - 2, *(o[0] for o in spans if o[1] == i - 1)])
            out = [(start, j, sub or cid) if o == s else o for o in out]
        return out

    def truth_concept(self, truth: Diagnosis, synonyms: Iterable[str] = ()) -> str | None:
        """The concept of a ground-truth diagnosis: by name, its accepted synonyms, then code."""
        for text in [truth.name, *synonyms]:
            found = self.lookup(text)
            if found.concept_id and not found.alternatives:
                return found.concept_id
        if truth.icd10:
            hits = self.by_icd10(truth.icd10)
            if len(hits) == 1:
                return hits[0].id
        return None

    def icd10_consistent(self, concept_id: str, code: str) -> bool:
        """Whether an ICD-10 code stated for a concept fits it (3-character category)."""
        return code.strip().upper()[:3] in self.concepts[concept_id].icd10_categories


@cache
def default_lexicon() -> Lexicon:
    return Lexicon.load()


def match_diagnosis(
    answer: str,
    truth: Diagnosis,
    *,
    accepted: Iterable[str] = (),
    answer_icd10: str | None = None,
    lexicon: Lexicon | None = None,
    judge: JudgeCache | None = None,
) -> DiagnosisMatch:
    """Compare a model's diagnosis with the truth; see the module docstring for the levels."""
    lex = lexicon or default_lexicon()
    accepted = list(accepted)
    found = lex.lookup(answer)
    a_id = found.concept_id
    t_id = lex.truth_concept(truth, accepted)

    def result(level: MatchLevel, *, by_judge: bool = False) -> DiagnosisMatch:
        return DiagnosisMatch(
            answer=answer,
            truth=truth.name,
            level=level,
            credit=CREDIT[level],
            correct=CREDIT[level] == 1.0,
            answer_concept=a_id,
            truth_concept=t_id,
            judge=by_judge,
            hedged=bool(found.alternatives),
            partial_reading=a_id is None or t_id is None or not found.whole,
        )

    key = normalise(answer)
    if key and key == normalise(truth.name):
        return result(MatchLevel.EXACT)
    if key and key in {normalise(s) for s in accepted}:
        return result(MatchLevel.SYNONYM)
    if a_id is not None and t_id is not None:
        if a_id == t_id:
            return result(MatchLevel.SYNONYM)
        if t_id in lex.ancestors(a_id):
            return result(MatchLevel.NARROWER)
        # the same disease once qualifiers (territory, mechanism, site) are dropped
        if _unqualified(lex, a_id) & _unqualified(lex, t_id):
            return result(MatchLevel.QUALIFIER)
    if judge is not None and (a_id is None or t_id is None or not found.whole):
        verdict = judge.get(answer, truth.name)
        if verdict is not None and verdict.equivalent:
            return result(MatchLevel.JUDGE, by_judge=True)
    if a_id is not None and t_id is not None and a_id in lex.ancestors(t_id):
        return result(MatchLevel.BROADER)
    t_codes = {truth.icd10[:3].upper()} if truth.icd10 else set()
    if t_id is not None:
        t_codes.add(lex[t_id].icd10[:3])
    a_codes = {lex[a_id].icd10[:3]} if a_id is not None else set()
    if answer_icd10:
        a_codes.add(answer_icd10.strip().upper()[:3])
    if t_codes & a_codes:
        return result(MatchLevel.ICD10_PREFIX)
    t_groups = {truth.group} if truth.group else set()
    if t_id is not None:
        t_groups |= lex[t_id].groups
    if a_id is not None and t_groups & lex[a_id].groups:
        return result(MatchLevel.GROUP)
    return result(MatchLevel.NONE)


def _in_clause(toks: list[str], clause: list[int], a: int, b: int, ref: int) -> set[str]:
    """The tokens in ``toks[a:b]`` that are in the same clause as token ``ref``."""
    return {toks[k] for k in range(a, min(b, len(toks))) if clause[k] == clause[ref]}


def _unqualified(lex: Lexicon, concept_id: str) -> set[str]:
    """The concepts left when qualifier steps are dropped (MCA infarct -> acute ischaemic stroke)."""
    c = lex[concept_id]
    if not c.qualifier:
        return {concept_id}
    return set().union(*(_unqualified(lex, p) for p in c.parents))


_PARTICLES = frozenset({"von", "van", "de", "di", "du", "le", "la", "da", "der"})


def _proper(word: str) -> bool:
    """A proper name as the lexicon writes it: capitalised, not an abbreviation ("Devic's")."""
    core = re.sub(r"'s?$", "", word)
    return len(core) > 2 and core[0].isupper() and core[1:].islower()
