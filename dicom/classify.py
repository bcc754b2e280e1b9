"""Classify a stack (T1, T1C, T2, FLAIR, DWI, ADC, SWI, CT, ...) from its headers alone.

Rules are ordered from the most specific evidence (ImageType flags a scanner writes for
derived maps, SOP class, modality) to acquisition physics (TR/TE/TI, scanning sequence) and
last the free-text description. Each result names the tags that decided it; when the headers
do not support a class, the answer is UNKNOWN rather than a guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from dicom.headers import FrameHeader
from dicom.records import Plane, SequenceClass

C = SequenceClass


@dataclass(frozen=True)
class SeriesContext:
    """What the classifier may know about the whole series a stack belongs to."""

    b_values: list[int] = field(default_factory=list)
    n_stacks: int = 1
    n_files: int = 0
    n_volumes: int = 1


@dataclass(frozen=True)
class Classification:
    series_class: SequenceClass
    detail: str
    reason: str
    confidence: float


def _words(text: str) -> str:
    """Lower-case text with separators folded to spaces, padded for whole-word regexes."""
    return " " + re.sub(r"[_\-/\\.,;:()\[\]+*]+", " ", text.lower()) + " "


_RE = {
    "mask": re.compile(r" (roi|mask|seg|segmentation|label|labels|labelmap) "),
    "localizer": re.compile(
        r"(scout|localizer|localiser|survey|tripilot|topogram|3 ?pl(ane)? loc| loc )"
    ),
    "adc": re.compile(r"( adc |apparent diffusion)"),
    "perfusion": re.compile(
        r" (asl|pcasl|pasl|perfusion|perfusion weighted|pwi|dsc|dce|cbf|cbv|rcbv|mtt|ttp) "
    ),
    "dwi": re.compile(r"( dwi| dti|diffusion| ep2d diff| resolve | dir\d+ )"),
    "fieldmap": re.compile(r"(field ?map|field mapping| b0 ?map|fmap)"),
    "fmri": re.compile(r" (bold|fmri|func|rest|resting|task|rs ?fmri)"),
    "swi": re.compile(r" (swi|swan|susceptibility|venobold|swip|mip swi|swi mip) "),
    "t2star": re.compile(r"( t2\*| t2 star| t2star| hemo| ffe t2| t2 gre | gre t2 )"),
    # A gradient-echo readout: T1 (spoiled GRE, MPRAGE) and T2* sequences alike use it.
    "gre": re.compile(r" gre "),
    "flair": re.compile(r" (flair|dark ?fluid|tirm) "),
    "t1": re.compile(r" (t1|t1w|t1 ?se|mprage|mp ?rage|spgr|bravo|tfl|tfe|vibe|fspgr|mpr) "),
    "t2": re.compile(r" (t2|t2w|tse|fse|haste|space) "),
    "pd": re.compile(r" (pd|pdw|proton density) "),
    "post": re.compile(r" (post|gad|gd|contrast|ce|\+c|c\+|postcontrast|enhanced) "),
}


_FIELDMAP_FLAGS = {"FIELD_MAP", "FIELDMAP", "FIELDMAPHZ", "B0"}


def _hint(description: str) -> SequenceClass | None:
    """What the free-text description alone suggests (weakest evidence)."""
    w = _words(description)
    for key, cls in (
        ("flair", C.FLAIR),
        ("swi", C.SWI),
        ("t2star", C.T2STAR),
        ("pd", C.PD),
        ("t1", C.T1),
        ("t2", C.T2),
    ):
        if _RE[key].search(w):
            return cls
    # 'GRE' alone, as in GE's 'AX GRE', conventionally names the T2* sequence of a neuro
    # protocol; _structural lets the acquisition overrule it (UIH's 'gre_fsp' is a T1 family).
    if _RE["gre"].search(w):
        return C.T2STAR
    return None


# An EPI readout in a sequence name: Siemens epfid (gradient echo) / epse (spin echo) / ep2d /
# ep_b0 (diffusion), GE epi / epiRT / epi2, Philips FEEPI / SEEPI, UIH epi_*.
_EPI_NAME = re.compile(r"(?:^|[^a-z]|fe|se)ep(?:i|fid|se|ir|\d|_)")
_GRE_EPI_NAME = re.compile(r"epfid|feepi")
_SE_EPI_NAME = re.compile(r"epse|seepi")
# The same readouts named in a description or protocol, read as whole words of ``_words``
# (separators already folded to spaces, so FE-EPI, FE_EPI, 'FE EPI' and 'EPI/T2*' read alike):
# [FE|FFE|GRE|GE|SE]EPI with an optional 2D/3D/RT/number suffix, ep2d*/ep3d*, epfid*, epse*.
# A whole word: 'epilepsy' and 'deep' are not EPI.
_EPI_WORD = re.compile(
    r" (?:(?:(?:fe|ffe|gre|ge|se) ?)?epi(?:\d?d|rt|\d)?|ep[23]d\w*|epfid\w*|epse\w*) "
)
_GRE_EPI_WORD = re.compile(r" (?:fe|ffe|gre|ge) ?epi|epfid")
_SE_EPI_WORD = re.compile(r" se ?epi|epse")


def _epi_readout(f: FrameHeader) -> str | None:
    """The headers that show an EPI readout, in words, or None."""
    name = f.sequence_name.lower()
    by_name = bool(_EPI_NAME.search(name))
    if "EP" in f.scanning_sequence:
        seq = f"ScanningSequence {'/'.join(f.scanning_sequence)}"
        return f"{seq} (SequenceName {f.sequence_name!r})" if by_name else seq
    if by_name:
        return f"SequenceName {f.sequence_name!r} names an EPI readout"
    for tag, text in (("SeriesDescription", f.description), ("ProtocolName", f.protocol)):
        if _EPI_WORD.search(_words(text)):
            return f"{tag} {text[:64]!r} names an EPI readout"
    return None


def _epi_echo(f: FrameHeader) -> tuple[str, str] | None:
    """Gradient or spin echo, and the header that says so; None when nothing says which."""
    ss = set(f.scanning_sequence)
    if ("GR" in ss) != ("SE" in ss):
        kind = "gradient" if "GR" in ss else "spin"
        return kind, f"ScanningSequence {'/'.join(f.scanning_sequence)}"
    if f.echo_pulse_sequence in ("GRADIENT", "SPIN"):
        return f.echo_pulse_sequence.lower(), f"EchoPulseSequence {f.echo_pulse_sequence}"
    name = f.sequence_name.lower()
    gre, se = _GRE_EPI_NAME.search(name), _SE_EPI_NAME.search(name)
    match = gre or se
    if match is not None and not (gre and se):
        kind = "gradient" if gre else "spin"
        return kind, f"{match.group()!r} in SequenceName is {kind}-echo EPI"
    for tag, text in (("SeriesDescription", f.description), ("ProtocolName", f.protocol)):
        w = _words(text)
        gre, se = _GRE_EPI_WORD.search(w), _SE_EPI_WORD.search(w)
        match = gre or se
        if match is not None and not (gre and se):
            kind = "gradient" if gre else "spin"
            return kind, f"{match.group().strip()!r} in {tag} is {kind}-echo EPI"
    return None


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def classify(
    frames: Sequence[FrameHeader], ctx: SeriesContext | None = None, plane: Plane | None = None
) -> Classification:
    """Classify one stack; ``frames`` share geometry and contrast."""
    ctx = ctx or SeriesContext()
    f = frames[0]
    it = set(f.image_type) | set(f.frame_type)
    text = f"{f.description} {f.protocol}".strip()
    w = _words(text)
    desc_q = repr(f.description[:64])
    dim = "3D" if f.mr_acquisition_type == "3D" else ("2D" if f.mr_acquisition_type == "2D" else "")

    # --- modality-level decisions -------------------------------------------------------
    if f.modality == "CT":
        if "LOCALIZER" in it or _RE["localizer"].search(w):
            return Classification(
                C.LOCALIZER,
                "CT localizer",
                f"Modality CT; ImageType {sorted(it)} / description {desc_q} marks a localizer",
                0.95,
            )
        contrast = f" with contrast ({f.contrast_agent})" if f.contrast_agent else ""
        return Classification(
            C.CT,
            "contrast-enhanced CT" if f.contrast_agent else "non-contrast CT",
            f"Modality CT{contrast}",
            0.99,
        )
    if f.modality not in ("MR", ""):
        return Classification(C.UNKNOWN, "", f"Modality {f.modality!r} is neither MR nor CT", 0.0)

    # --- masks and localisers ---------------------------------------------------------------
    if _RE["mask"].search(w):
        return Classification(
            C.MASK,
            "region of interest / label mask",
            f"SeriesDescription {desc_q} names a mask or ROI",
            0.85,
        )
    if "LOCALIZER" in it or _RE["localizer"].search(w):
        src = "ImageType LOCALIZER" if "LOCALIZER" in it else f"SeriesDescription {desc_q}"
        return Classification(C.LOCALIZER, "", f"{src} marks a localizer/scout", 0.95)

    # --- diffusion-derived maps flagged in ImageType -----------------------------------------
    if "ADC" in it:
        return Classification(
            C.ADC, "apparent diffusion coefficient map", "ImageType contains ADC", 0.99
        )
    if "TRACEW" in it or "TRACE" in it:
        b = f" b={round(f.b_value)}" if f.b_value else ""
        return Classification(
            C.TRACE,
            f"trace-weighted DWI{b}",
            f"ImageType contains {'TRACEW' if 'TRACEW' in it else 'TRACE'}",
            0.98,
        )
    derived_flags = it & {"FA", "TENSOR_B0", "EXP", "EADC", "COLFA", "RA", "TENSOR"}
    if derived_flags:
        return Classification(
            C.DERIVED_MAP,
            "diffusion-derived map (" + "/".join(sorted(derived_flags)) + ")",
            f"ImageType contains {sorted(derived_flags)}",
            0.97,
        )
    if _RE["adc"].search(w):
        return Classification(
            C.ADC,
            "apparent diffusion coefficient map",
            f"SeriesDescription {desc_q} names an ADC map",
            0.8,
        )

    # --- perfusion ------------------------------------------------------------------------------
    if it & {"ASL", "PERFUSION"} or _RE["perfusion"].search(w):
        src = (
            f"ImageType {sorted(it & {'ASL', 'PERFUSION'})}"
            if it & {"ASL", "PERFUSION"}
            else f"SeriesDescription {desc_q}"
        )
        return Classification(
            C.PERFUSION,
            "ASL" if "ASL" in it or " asl" in w else "perfusion",
            f"{src} marks perfusion imaging",
            0.95,
        )

    # --- RGB secondary captures (colour maps) ----------------------------------------------------
    if f.samples_per_pixel == 3:
        return Classification(
            C.DERIVED_MAP,
            "colour (RGB) derived image",
            f"SamplesPerPixel 3 ({f.photometric}), ImageType {sorted(it)}",
            0.8,
        )

    # --- diffusion acquisitions --------------------------------------------------------------------
    has_b = bool(ctx.b_values) and max(ctx.b_values) > 0
    if has_b or "DIFFUSION" in it or (_RE["dwi"].search(w) and "EP" in f.scanning_sequence):
        bs = ", ".join(str(b) for b in ctx.b_values) or "unknown"
        here = f"; this stack b={round(f.b_value)}" if f.b_value is not None else ""
        why = []
        if has_b:
            why.append(f"diffusion b-values {bs} in the headers")
        if "DIFFUSION" in it:
            why.append("ImageType DIFFUSION")
        if _RE["dwi"].search(w):
            why.append(f"SeriesDescription {desc_q}")
        detail = f"b={round(f.b_value)}" if f.b_value is not None else "diffusion-weighted"
        return Classification(C.DWI, detail, "; ".join(why) + here, 0.95 if has_b else 0.85)

    # --- field maps and functional MRI ----------------------------------------------------------------
    if it & _FIELDMAP_FLAGS or _RE["fieldmap"].search(w):
        src = (
            f"ImageType {sorted(it & _FIELDMAP_FLAGS)}"
            if it & _FIELDMAP_FLAGS
            else f"SeriesDescription {desc_q}"
        )
        return Classification(C.FIELDMAP, "B0 field map", f"{src} marks a field map", 0.9)
    epi = _epi_readout(f)
    if _RE["fmri"].search(w) and (epi or not f.scanning_sequence):
        return Classification(
            C.FMRI,
            "BOLD EPI",
            f"SeriesDescription {desc_q} names a functional run; ScanningSequence {'/'.join(f.scanning_sequence) or '?'}"
            + (f"; {epi}" if epi and not epi.startswith("ScanningSequence") else ""),
            0.9,
        )

    # --- susceptibility ---------------------------------------------------------------------------------
    if "SWI" in it or _RE["swi"].search(w):
        variant = (
            "minIP"
            if it & {"MNIP", "MIP", "MIN IP"}
            else ("phase" if it & {"P", "PHASE"} else "magnitude")
        )
        src = "ImageType SWI" if "SWI" in it else f"SeriesDescription {desc_q}"
        return Classification(
            C.SWI, f"SWI {variant}", f"{src}; EchoTime {_fmt(f.echo_time)} ms", 0.95
        )

    if epi:
        return _epi(f, epi, ctx, desc_q)

    return _structural(f, it, w, desc_q, dim)


def _epi(f: FrameHeader, epi: str, ctx: SeriesContext, desc_q: str) -> Classification:
    """EPI without diffusion weighting, a description or ImageType that names it.

    Repeated volumes at the same slice positions are a time series: a dynamic susceptibility
    contrast (DSC) perfusion run when a contrast agent was given, a functional run otherwise.
    A single gradient-echo EPI volume is T2*-weighted (as in a stroke protocol's fast T2*).
    """
    n = ctx.n_volumes
    if n > 1:
        repeated = f"{epi}, {n} volumes at the same slice positions"
        if f.contrast_agent:
            return Classification(
                C.PERFUSION,
                "DSC perfusion (EPI time series with contrast)",
                f"{repeated}, ContrastBolusAgent {f.contrast_agent!r}: a dynamic susceptibility contrast run",
                0.85,
            )
        return Classification(
            C.FMRI,
            "EPI time series",
            f"{repeated}, no contrast agent, no diffusion weighting: a functional (BOLD) time series",
            0.7,
        )
    echo = _epi_echo(f)
    te = f"EchoTime {_fmt(f.echo_time)} ms"
    if echo is None:
        return Classification(
            C.UNKNOWN,
            "",
            f"{epi}, one volume, no diffusion weighting, and no header says gradient or spin "
            f"echo ({te}); SeriesDescription {desc_q}",
            0.0,
        )
    kind, src = echo
    said = "" if src in epi else f" ({src})"
    if kind == "spin":
        return Classification(
            C.UNKNOWN,
            "",
            f"{epi}: one volume of spin-echo EPI{said} without diffusion weighting or a "
            f"description that names it ({te}); SeriesDescription {desc_q}",
            0.0,
        )
    if f.echo_time is not None and f.echo_time < 15:
        return Classification(
            C.UNKNOWN,
            "",
            f"{epi}: one gradient-echo EPI volume{said}, but {te} is too short for T2* "
            f"weighting; SeriesDescription {desc_q}",
            0.0,
        )
    return Classification(
        C.T2STAR,
        "gradient-echo EPI T2*-weighted",
        f"{epi}: a single gradient-echo EPI volume{said}, {te}, no diffusion weighting: "
        "T2*-weighted",
        0.7 if f.echo_time is not None else 0.5,
    )


def _structural(f: FrameHeader, it: set[str], w: str, desc_q: str, dim: str) -> Classification:
    """T1 / T2 / PD / FLAIR / T2* from the acquisition physics, checked against the description."""
    tr, te, ti = f.repetition_time, f.echo_time, f.inversion_time
    ss = set(f.scanning_sequence)
    sv = set(f.sequence_variant)
    inversion = "IR" in ss or f.inversion_recovery or "MP" in sv or bool(ti and ti > 0)
    # Philips writes FFE/TFE (fast field echo) for gradient echo.
    gradient = bool(ss & {"GR", "FFE", "TFE"}) or f.echo_pulse_sequence == "GRADIENT"
    spin = "SE" in ss or f.echo_pulse_sequence == "SPIN" or "M_SE" in it
    tags = (
        f"ScanningSequence {'/'.join(f.scanning_sequence) or '-'}, SequenceVariant {'/'.join(f.sequence_variant) or '-'}, "
        f"TR {_fmt(tr)} ms, TE {_fmt(te)} ms, TI {_fmt(ti)} ms"
    )
    hint = _hint(f"{f.description} {f.protocol}")
    readout_only = hint is C.T2STAR and not _RE["t2star"].search(w)
    physics: SequenceClass | None = None
    detail = ""
    if inversion and ti is not None and ti >= 1400:
        if te is not None and te < 40:
            physics, detail = C.T1, "T1-FLAIR (inversion recovery, short TE)"
        else:
            physics, detail = C.FLAIR, "FLAIR (long TI nulls fluid)"
    elif inversion and ti is not None and 300 <= ti < 1400 and (te is None or te < 20):
        physics, detail = C.T1, "inversion-prepared T1 (MPRAGE-type)"
    elif inversion and ti is not None and 0 < ti < 300:
        physics, detail = C.T2, "STIR (short TI inversion recovery)"
    elif gradient and not spin and te is not None:
        if te >= 15:
            physics, detail = C.T2STAR, "gradient-echo T2*-weighted"
        elif tr is not None and tr < 800:
            physics, detail = C.T1, "spoiled gradient-echo T1"
    elif (spin or not gradient) and tr is not None and te is not None:
        if tr < 1000 and te < 30:
            physics, detail = C.T1, "spin-echo T1"
        elif tr >= 1500 and te >= 60:
            physics, detail = C.T2, "spin-echo / TSE T2"
        elif tr >= 1500 and te < 40:
            physics, detail = C.PD, "proton-density"

    if readout_only and physics is not None and physics is not C.T2STAR:
        # The description names only the readout ('gre'), the acquisition names the contrast.
        hint = None
    if physics is None and hint is None:
        return Classification(
            C.UNKNOWN, "", f"no rule matched: {tags}; SeriesDescription {desc_q}", 0.0
        )
    if physics is None:
        cls = hint
        reason = f"SeriesDescription {desc_q} suggests {hint}; acquisition parameters inconclusive ({tags})"
        confidence = 0.6
        detail = f"{hint} (from description)"
    elif hint is None or hint == physics or (physics is C.T2STAR and hint is C.SWI):
        cls = physics
        agree = f"; SeriesDescription {desc_q} agrees" if hint == physics else ""
        reason = f"{tags}: {detail}{agree}"
        confidence = 0.95 if hint == physics else 0.85
    elif physics is C.FLAIR and hint is C.T2:
        cls, confidence = physics, 0.9
        reason = f"{tags}: {detail}; SeriesDescription {desc_q} says T2, and a T2 with fluid nulled is FLAIR"
    else:
        # Headers and description disagree: do not guess.
        return Classification(
            C.UNKNOWN,
            "",
            f"acquisition suggests {physics} ({tags}) but SeriesDescription {desc_q} suggests {hint}",
            0.0,
        )
    assert cls is not None
    if cls is C.T1 and (f.contrast_agent or _RE["post"].search(w)):
        if f.contrast_agent:
            return Classification(
                C.T1C,
                f"post-contrast {detail}",
                f"{reason}; ContrastBolusAgent {f.contrast_agent!r}",
                min(confidence, 0.95),
            )
        return Classification(
            C.T1C,
            f"post-contrast {detail}",
            f"{reason}; SeriesDescription {desc_q} marks post-contrast (no ContrastBolusAgent tag)",
            min(confidence, 0.7),
        )
    if dim:
        detail = f"{dim} {detail}"
    return Classification(cls, detail, reason, confidence)
