"""Words models use for where, on which sequence and how a lesion looks, mapped to the
benchmark's vocabulary: ``records.REGIONS``, ``Hemisphere``, ``SequenceClass`` values, signal
direction, ``Enhancement`` and planes."""

from __future__ import annotations

import re

from evaluation.case import REGIONS, Enhancement, Signal
from evaluation.scoring.text import normalise

_MCA = ("frontal", "parietal", "temporal", "insula", "basal ganglia", "internal capsule")
# phrase -> regions (keys are normalised below); longest phrases are tried first
_REGION_PHRASES: dict[str, tuple[str, ...]] = {
    "frontal": ("frontal",),
    "prefrontal": ("frontal",),
    "precentral": ("frontal",),
    "motor cortex": ("frontal",),
    "frontal operculum": ("frontal", "insula"),
    "parietal": ("parietal",),
    "postcentral": ("parietal",),
    "precuneus": ("parietal",),
    "supramarginal": ("parietal",),
    "angular gyrus": ("parietal",),
    "temporal": ("temporal",),
    "hippocampus": ("temporal",),
    "hippocampal": ("temporal",),
    "amygdala": ("temporal",),
    "mesial temporal": ("temporal",),
    "occipital": ("occipital",),
    "calcarine": ("occipital",),
    "cuneus": ("occipital",),
    "visual cortex": ("occipital",),
    "frontoparietal": ("frontal", "parietal"),
    "parietooccipital": ("parietal", "occipital"),
    "parieto occipital": ("parietal", "occipital"),
    "temporoparietal": ("temporal", "parietal"),
    "temporo parietal": ("temporal", "parietal"),
    "frontotemporal": ("frontal", "temporal"),
    "fronto temporal": ("frontal", "temporal"),
    "fronto parietal": ("frontal", "parietal"),
    "temporooccipital": ("temporal", "occipital"),
    "temporo occipital": ("temporal", "occipital"),
    "insula": ("insula",),
    "insular": ("insula",),
    "basal ganglia": ("basal ganglia",),
    "basal ganglion": ("basal ganglia",),
    "lentiform": ("basal ganglia",),
    "putamen": ("basal ganglia",),
    "putaminal": ("basal ganglia",),
    "caudate": ("basal ganglia",),
    "globus pallidus": ("basal ganglia",),
    "pallidum": ("basal ganglia",),
    "striatum": ("basal ganglia",),
    "striatal": ("basal ganglia",),
    "thalamus": ("thalamus",),
    "thalamic": ("thalamus",),
    "pulvinar": ("thalamus",),
    "internal capsule": ("internal capsule",),
    "plic": ("internal capsule",),
    "corpus callosum": ("corpus callosum",),
    "callosal": ("corpus callosum",),
    "splenium": ("corpus callosum",),
    "genu": ("corpus callosum",),
    "callososeptal": ("corpus callosum", "periventricular white matter"),
    "periventricular": ("periventricular white matter",),
    "pvwm": ("periventricular white matter",),
    "paraventricular": ("periventricular white matter",),
    "Dawson's fingers": ("periventricular white matter",),
    # the atlas has no deep white matter region; the periventricular one is its nearest
    "deep white matter": ("periventricular white matter",),
    "centrum semiovale": ("periventricular white matter",),
    "corona radiata": ("periventricular white matter",),
    "juxtacortical": ("juxtacortical",),
    "subcortical U-fibres": ("juxtacortical",),
    "U-fibres": ("juxtacortical",),
    "leukocortical": ("juxtacortical",),
    "grey-white junction": ("juxtacortical",),
    "grey-white matter junction": ("juxtacortical",),
    "corticomedullary junction": ("juxtacortical",),
    "brainstem": ("brainstem",),
    "brain stem": ("brainstem",),
    "pons": ("brainstem",),
    "pontine": ("brainstem",),
    "midbrain": ("brainstem",),
    "mesencephalon": ("brainstem",),
    "medulla": ("brainstem",),
    "medullary": ("brainstem",),
    "cerebral peduncle": ("brainstem",),
    "cerebellum": ("cerebellum",),
    "cerebellar": ("cerebellum",),
    "vermis": ("cerebellum",),
    "vermian": ("cerebellum",),
    "dentate": ("cerebellum",),
    "middle cerebellar peduncle": ("cerebellum", "brainstem"),
    "infratentorial": ("brainstem", "cerebellum"),
    "posterior fossa": ("brainstem", "cerebellum"),
    "extra axial": ("extra-axial",),
    "extraaxial": ("extra-axial",),
    "dural": ("extra-axial",),
    "dural based": ("extra-axial",),
    "meningeal": ("extra-axial",),
    "convexity": ("extra-axial",),
    "falx": ("extra-axial",),
    "falcine": ("extra-axial",),
    "parafalcine": ("extra-axial",),
    "tentorium": ("extra-axial",),
    "tentorial": ("extra-axial",),
    "subdural": ("extra-axial",),
    "epidural": ("extra-axial",),
    "extradural": ("extra-axial",),
    "cerebellopontine angle": ("extra-axial",),
    "cpa": ("extra-axial",),
    "sphenoid wing": ("extra-axial",),
    "olfactory groove": ("extra-axial",),
    "mca territory": _MCA,
    "middle cerebral artery territory": _MCA,
    "aca territory": ("frontal", "parietal", "corpus callosum"),
    "anterior cerebral artery territory": ("frontal", "parietal", "corpus callosum"),
    "pca territory": ("occipital", "thalamus", "temporal"),
    "posterior cerebral artery territory": ("occipital", "thalamus", "temporal"),
    "U-fibers": ("juxtacortical",),
    "gray-white junction": ("juxtacortical",),
}
_REGION_WORDS = {normalise(k): v for k, v in _REGION_PHRASES.items()}
_REGION_MAX = max(len(k.split()) for k in _REGION_WORDS)

# Regions that touch (same side): a finding there is "the right lesion in the wrong place".
_ADJACENT_PAIRS = {
    ("frontal", "parietal"),
    ("frontal", "temporal"),
    ("frontal", "insula"),
    ("parietal", "occipital"),
    ("parietal", "temporal"),
    ("temporal", "occipital"),
    ("temporal", "insula"),
    ("insula", "basal ganglia"),
    ("basal ganglia", "internal capsule"),
    ("basal ganglia", "thalamus"),
    ("internal capsule", "thalamus"),
    ("periventricular white matter", "corpus callosum"),
    ("periventricular white matter", "basal ganglia"),
    ("brainstem", "cerebellum"),
    ("brainstem", "thalamus"),
    ("extra-axial", "frontal"),
    ("extra-axial", "parietal"),
    ("extra-axial", "temporal"),
    ("extra-axial", "occipital"),
    ("extra-axial", "cerebellum"),
}
ADJACENT: frozenset[frozenset[str]] = frozenset(frozenset(p) for p in _ADJACENT_PAIRS)
assert all(r in REGIONS for p in _ADJACENT_PAIRS for r in p)
assert all(r in REGIONS for v in _REGION_WORDS.values() for r in v)

_SIDES = {
    "left": "left",
    "l": "left",
    "lt": "left",
    "right": "right",
    "r": "right",
    "rt": "right",
    "bilateral": "bilateral",
    "bilaterally": "bilateral",
    "both": "bilateral",
    "midline": "midline",
    "median": "midline",
    "central": "midline",
}


def regions_in(text: str | None) -> set[str]:
    """Atlas regions a location phrase names ("left frontal lobe" -> {"frontal"})."""
    if not text:
        return set()
    toks = normalise(text.replace("-", " ")).split()
    found: set[str] = set()
    used = [False] * len(toks)
    for n in range(min(_REGION_MAX, len(toks)), 0, -1):
        for i in range(len(toks) - n + 1):
            if any(used[i : i + n]):
                continue
            hit = _REGION_WORDS.get(" ".join(toks[i : i + n]))
            if hit:
                found.update(hit)
                used[i : i + n] = [True] * n
    return found


def region_phrases() -> dict[str, tuple[str, ...]]:
    """Every phrase ``regions_in`` reads, as written, with the atlas regions it names."""
    return dict(_REGION_PHRASES)


def side_words() -> dict[str, str]:
    """Every word ``side_in`` reads, with the hemisphere it names."""
    return dict(_SIDES)


def side_in(text: str | None) -> str | None:
    """The hemisphere a phrase names, or None; "left and right" is bilateral."""
    if not text:
        return None
    sides = {_SIDES[t] for t in normalise(text).split() if t in _SIDES}
    if {"left", "right"} <= sides or "bilateral" in sides:
        return "bilateral"
    return sides.pop() if len(sides) == 1 else None


def sides_compatible(a: str | None, b: str | None) -> bool:
    """Unstated, bilateral and midline sides are compatible with anything; left != right."""
    return a is None or b is None or a == b or {a, b} & {"bilateral", "midline"} != set()


# --------------------------------------------------------------------------- sequences

_SEQ_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), c)
    for p, c in (
        (r"\bflair\b|fluid attenuat|dark fluid", "FLAIR"),
        (r"\badc\b|apparent diffusion", "ADC"),
        (r"\bswi\b|susceptibility", "SWI"),
        (r"t2 ?\*|t2 star|\bgre\b|gradient echo|gradient recalled", "T2STAR"),
        (r"\bdwi\b|diffusion|\btrace\b|\bb ?1000\b|\bb ?= ?1000\b", "DWI"),
        (r"\bperfusion\b|\bdsc\b|\bcbf\b|\bcbv\b", "PERFUSION"),
        (
            r"\bt1\b.*(post|contrast|gad|\bgd\b|\+ ?c\b|c ?\+|enhanc|\bce\b)"
            r"|(post|contrast|gad|\bgd\b|\bce\b).*\bt1\b|\bt1 ?c\+?|\bt1ce\b|\bt1gd\b",
            "T1C",
        ),
        (r"\bt1\b|t1 ?w|mprage|\bspgr\b|\bbravo\b", "T1"),
        (r"\bt2\b|t2 ?w|\btse\b|\bfse\b", "T2"),
        (r"\bpd\b|proton density", "PD"),
        (r"\bct\b|computed tomograph|\bncct\b|\bcect\b|\bcta\b", "CT"),
    )
)
# header classes that show the same thing to a reader
EQUIVALENT_SEQUENCES: dict[str, str] = {"TRACE": "DWI", "T2STAR": "SWI"}


def sequence_classes() -> list[str]:
    """The SequenceClass values ``sequence_class`` can give, in the order its rules are tried."""
    return list(dict.fromkeys(c for _, c in _SEQ_RULES))


def sequence_class(text: str | None) -> str | None:
    """The SequenceClass value a sequence name means ("T2-FLAIR" -> "FLAIR"), or None."""
    if not text:
        return None
    t = text.lower().replace("-", " ").replace("_", " ")
    t = re.sub(r"(t[12])(?=[a-z])", r"\1 ", t)  # "t1post", "t2w"
    for pattern, cls in _SEQ_RULES:
        if pattern.search(t):
            return cls
    return None


def same_sequence(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return EQUIVALENT_SEQUENCES.get(a, a) == EQUIVALENT_SEQUENCES.get(b, b)


def modality_of(sequence: str | None) -> str | None:
    """ "CT" or "MRI" for a SequenceClass value."""
    if sequence is None:
        return None
    return "CT" if sequence == "CT" else "MRI"


def plane_in(text: str | None) -> str | None:
    if not text:
        return None
    t = text.lower()
    for plane, words in (
        ("axial", ("axial", "transverse", "transaxial")),
        ("sagittal", ("sagittal",)),
        ("coronal", ("coronal",)),
    ):
        if any(w in t for w in words):
            return plane
    return None


# --------------------------------------------------------------------------- signal

_UP, _DOWN, _ISO, _MIXED = "up", "down", "iso", "mixed"
_DIRECTION = {
    Signal.HYPER: _UP,
    Signal.HYPERDENSE: _UP,
    Signal.HYPO: _DOWN,
    Signal.HYPODENSE: _DOWN,
    Signal.ISO: _ISO,
    Signal.ISODENSE: _ISO,
    Signal.MIXED: _MIXED,
}
_SIGNAL_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), d)
    for p, d in (
        (r"mixed|heterogeneous signal|heterogeneou", _MIXED),
        (r"\biso ?(intense|dense|attenuat)", _ISO),
        (r"hyper ?(intens|dens|attenuat)|bright|high (signal|density)|increased signal", _UP),
        (r"hypo ?(intens|dens|attenuat)|\bdark\b|low (signal|density)|decreased signal", _DOWN),
        (r"signal void|blooming|susceptibility artefact|susceptibility artifact", _DOWN),
    )
)


def direction_of(signal: Signal) -> str:
    return _DIRECTION[signal]


def signal_direction(text: str | None, sequence: str | None = None) -> str | None:
    """ "up", "down", "iso" or "mixed" for a signal phrase; restricted diffusion depends on
    the sequence (bright on DWI, dark on ADC)."""
    if not text:
        return None
    t = text.lower().replace("-", " ")
    if re.search(r"restrict", t) and not re.search(r"\bno\b|without|unrestrict|facilitat", t):
        return _DOWN if sequence == "ADC" else _UP
    for pattern, d in _SIGNAL_RULES:
        if pattern.search(t):
            return d
    return None


def directions_compatible(a: str, b: str) -> bool:
    return a == b or _MIXED in (a, b)


def enhancement_of(text: str | None) -> Enhancement | str | None:
    """An Enhancement, "any" (enhancing, pattern unstated) or None when not mentioned."""
    if not text:
        return None
    t = text.lower().replace("-", " ")
    if re.search(r"non ?enhanc|no (contrast )?enhancement|without enhancement|not enhanc", t):
        return Enhancement.NONE
    if t.strip() in ("none", "no", "absent"):
        return Enhancement.NONE
    if re.search(r"\bring\b|\brim\b|peripheral", t):
        return Enhancement.RING
    if re.search(r"nodular", t):
        return Enhancement.NODULAR
    if re.search(r"heterogeneous|patchy", t):
        return Enhancement.HETEROGENEOUS
    if re.search(r"homogeneous|avid|uniform|solid|dural tail", t):
        return Enhancement.HOMOGENEOUS
    if re.search(r"enhanc", t):
        return "any"
    return None


def enhancement_compatible(stated: Enhancement | str, truth: Enhancement) -> bool:
    if stated == "any":
        return truth is not Enhancement.NONE
    if Enhancement.NONE in (stated, truth):
        return stated == truth
    loose = {Enhancement.HETEROGENEOUS}  # heterogeneous fits ring and nodular patterns
    return stated == truth or (stated in loose and truth is not Enhancement.HOMOGENEOUS)


# --------------------------------------------------------------------------- size

_SIZE = re.compile(
    r"(\d+(?:\.\d+)?)((?:\s*(?:x|×|by)\s*\d+(?:\.\d+)?)*)\s*(mm|cm|millimet\w*|centimet\w*)\b",
    re.IGNORECASE,
)


def size_mm_in(text: str | None) -> float | None:
    """The largest dimension a phrase states, in mm ("3 x 2.5 cm" -> 30.0), or None."""
    if not text:
        return None
    best: float | None = None
    for m in _SIZE.finditer(text):
        numbers = [float(m.group(1))] + [float(x) for x in re.findall(r"\d+(?:\.\d+)?", m.group(2))]
        scale = 10.0 if m.group(3).lower().startswith(("cm", "centi")) else 1.0
        value = max(numbers) * scale
        if 0 < value < 1000:
            best = value if best is None else max(best, value)
    return best


def sizes_compatible(stated: float, truth: float) -> bool:
    """A stated size contradicts the truth when it is off by more than a factor of 2.5 and
    more than 5 mm (sizes read off a few slices are rough)."""
    lo, hi = sorted((stated, truth))
    return lo > 0 and (hi / lo <= 2.5 or hi - lo <= 5.0)
