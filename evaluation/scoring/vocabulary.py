"""The truth in the answers' words: each controlled field of a case's ground truth read through
the vocabulary the answers are read through, or refused with the allowed values and the nearest.

A hospital writes its truth as it speaks ("frontal lobe", "L", "T2-FLAIR", "restricted",
"ischemic stroke"); the scorers compare canonical values (``REGIONS``, ``Hemisphere``,
``SequenceClass``, ``Signal``, ``Enhancement``, ``DiseaseGroup``). A manifest is validated with
``TRUTH_VOCABULARY`` in its context (``evaluation.case.VOCABULARY_CONTEXT``), so what its truth
says is read by exactly the rules that read a model's findings (``anatomy.regions_in``,
``side_in``, ``sequence_class``, ``signal_direction``, ``enhancement_of``; the lexicon for a
disease named as a group). A canonical value is kept as written; words that name no value, or
several regions, are refused: ``cases check`` prints the message with its field path.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from dicom import SequenceClass
from evaluation.case import REGIONS, DiseaseGroup, Enhancement, Hemisphere, Signal
from evaluation.scoring import anatomy as A
from evaluation.scoring.lexicon import default_lexicon
from evaluation.scoring.text import normalise

MAX_CHARS = 200  # longer text is no value of a controlled field
_SIGNAL_OF = {
    # direction -> (on MR, on CT)
    "up": (Signal.HYPER, Signal.HYPERDENSE),
    "down": (Signal.HYPO, Signal.HYPODENSE),
    "iso": (Signal.ISO, Signal.ISODENSE),
    "mixed": (Signal.MIXED, Signal.MIXED),
}


class VocabularyError(ValueError):
    """A value of a controlled field that the vocabulary does not read as one allowed value."""


def _short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(
    value: str, what: str, allowed: Iterable[str], near: Iterable[str] | None, why: str = ""
) -> VocabularyError:
    """The refusal: what is wrong, the nearest allowed value or other word (none when ``near``
    is None: the words were read, and a spelling is not what is wrong) and the allowed values."""
    allowed = list(allowed)
    key = " ".join(value.lower().replace("_", " ").replace("-", " ").split())[:MAX_CHARS]
    pool = {c.lower().replace("_", " ").replace("-", " "): c for c in [*allowed, *(near or ())]}
    guess = difflib.get_close_matches(key, list(pool), n=1, cutoff=0.6) if near is not None else []
    if not guess and near is not None:  # a misspelt word inside a phrase ("frontl lobe")
        for word in key.split():
            guess = difflib.get_close_matches(word, list(pool), n=1, cutoff=0.75)
            if guess:
                break
    hint = f"did you mean {pool[guess[0]]!r}? " if guess else ""
    reason = why or f"is not a {what} the vocabulary reads"
    return VocabularyError(
        f"{_short(value)} {reason} ({hint}allowed: {', '.join(allowed)}; "
        "other words for them: docs/cases.md)"
    )


def _bounded(value: str, what: str) -> str:
    if len(value) > MAX_CHARS:
        raise VocabularyError(
            f"{_short(value)} is too long for a {what} ({len(value)} characters; "
            f"at most {MAX_CHARS})"
        )
    return value.strip()


def truth_region(value: str) -> str:
    """The atlas region a truth's region (or lobe) names: "frontal lobe" -> "frontal"."""
    text = _bounded(value, "region")
    if text in REGIONS:
        return text
    found = A.regions_in(text)
    if len(found) == 1:
        return found.pop()
    if found:
        names = ", ".join(r for r in REGIONS if r in found)
        raise _refuse(
            value,
            "region",
            REGIONS,
            None,
            why=f"names {len(found)} regions ({names}): give the one the lesion is in as "
            "region (and its lobe as lobe), or one lesion per region",
        )
    raise _refuse(value, "region", REGIONS, A.region_phrases())


def truth_hemisphere(value: str) -> str:
    """The hemisphere a truth's side names: "L", "left hemisphere" -> "left"."""
    text = _bounded(value, "hemisphere")
    allowed = [h.value for h in Hemisphere]
    if text in allowed:
        return text
    side = A.side_in(text)
    if side is None:
        raise _refuse(value, "hemisphere", allowed, A.side_words())
    return side


def truth_sequence(value: str) -> str:
    """The series class a truth's sequence names: "T2-FLAIR" -> "FLAIR", "ADC map" -> "ADC"."""
    text = _bounded(value, "sequence")
    if text in {s.value for s in SequenceClass}:
        return text
    found = A.sequence_class(text)
    if found is None:
        raise _refuse(value, "sequence", A.sequence_classes(), ("TRACE", "T2*", "DWI b1000"))
    return found


def truth_signal(value: str, sequence: str) -> str:
    """The signal a truth states on a sequence: "bright" -> hyperintense (hyperdense on CT),
    "restricted" -> hyperintense on DWI and hypointense on ADC."""
    text = _bounded(value, "signal")
    allowed = [s.value for s in Signal]
    if text in allowed:
        return text
    direction = A.signal_direction(text, sequence)
    if direction is None:
        raise _refuse(value, f"signal on {sequence}", allowed, ("bright", "dark", "restricted"))
    return _SIGNAL_OF[direction][sequence == "CT"].value


def truth_enhancement(value: str) -> str:
    """The enhancement pattern a truth states: "ring-enhancing" -> "ring"."""
    text = _bounded(value, "enhancement")
    allowed = [e.value for e in Enhancement]
    if text in allowed:
        return text
    found = A.enhancement_of(text)
    if found == "any":
        raise _refuse(value, "enhancement", allowed, None, why="names no enhancement pattern")
    if found is None:
        raise _refuse(value, "enhancement", allowed, ("non-enhancing", "rim"))
    return Enhancement(found).value


def truth_group(value: str) -> str:
    """The disease group a truth names: the group's words in either spelling ("ischemic
    stroke", "tumor"), or a disease the lexicon knows by that whole name (its group)."""
    text = _bounded(value, "disease group")
    allowed = [g.value for g in DiseaseGroup]
    if text in allowed:
        return text
    key = normalise(text.replace("_", " "))
    for group in DiseaseGroup:
        if key == normalise(group.value.replace("_", " ")):
            return group.value
    lex = default_lexicon()
    found = lex.lookup(text)
    if found.concept_id is not None and found.whole and not found.alternatives:
        return lex[found.concept_id].group.value
    raise _refuse(value, "disease group", allowed, ())


class _TruthVocabulary:
    """The vocabulary a manifest's truth is read through (``evaluation.case.TruthVocabulary``)."""

    def region(self, value: str) -> str:
        return truth_region(value)

    def hemisphere(self, value: str) -> str:
        return truth_hemisphere(value)

    def sequence(self, value: str) -> str:
        return truth_sequence(value)

    def signal(self, value: str, sequence: str) -> str:
        return truth_signal(value, sequence)

    def enhancement(self, value: str) -> str:
        return truth_enhancement(value)

    def group(self, value: str) -> str:
        return truth_group(value)


TRUTH_VOCABULARY = _TruthVocabulary()


def _codes(values: Iterable[str]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def vocabulary_markdown() -> str:
    """The allowed values and the words read as them, for docs/cases.md (a test compares)."""
    by_region: dict[str, list[str]] = {r: [] for r in REGIONS}
    several: list[str] = []
    for phrase, regions in A.region_phrases().items():
        if len(regions) == 1:
            if phrase != regions[0]:
                by_region[regions[0]].append(phrase)
        else:
            several.append(f"`{phrase}` ({', '.join(regions)})")
    sides: dict[str, list[str]] = {h.value: [] for h in Hemisphere}
    for word, side in A.side_words().items():
        if word != side:
            sides[side].append(word)
    lines = [
        "A lesion's `region` (and `lobe`) is one of these atlas regions, or a phrase that names",
        "exactly one of them (`left frontal lobe` is `frontal`); words around it are not read:",
        "",
    ]
    lines += [
        f"- `{r}`" + (f": also {_codes(words)}" if words else "") for r, words in by_region.items()
    ]
    lines += [
        "",
        "Phrases that name several regions are refused in the truth (give one region per",
        f"lesion): {', '.join(several)}.",
        "",
        "`hemisphere`: "
        + "; ".join(f"`{h}`" + (f" ({_codes(w)})" if w else "") for h, w in sides.items())
        + "; a phrase holding one of these words (`left hemisphere`).",
        "",
        "`signal` maps a series class to a signal. The series class: "
        + _codes(s.value for s in SequenceClass)
        + ", or a sequence name read as one of "
        + _codes(A.sequence_classes())
        + " (`T2-FLAIR` is `FLAIR`, `diffusion` is `DWI`, `ADC map` is `ADC`, `T1 post-contrast`"
        " is `T1C`).",
        "The signal: "
        + _codes(s.value for s in Signal)
        + ", or words for a direction (`bright`, `high signal`, `dark`, `restricted`, "
        "`hyperintense on DWI`): up is hyperintense (hyperdense on `CT`), `restricted` is "
        "hyperintense on DWI and hypointense on ADC.",
        "",
        "`enhancement`: "
        + _codes(e.value for e in Enhancement)
        + ", or words for one (`ring-enhancing`, `rim`, `non-enhancing`, `patchy`); "
        "`enhancing` alone names no pattern and is refused.",
        "",
        "`final_diagnosis.group` (and a differential's `group`): "
        + _codes(g.value for g in DiseaseGroup)
        + ", in either spelling with spaces or hyphens (`ischemic stroke`, `tumor`), or a "
        "disease the lexicon knows by its whole name (`multiple sclerosis` is `demyelinating`).",
        "",
    ]
    return "\n".join(lines)
