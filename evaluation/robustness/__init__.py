"""The grounding and robustness audit (issue 39): does the model read the image?

The same questions on deterministic variants of a case (:class:`VariantKind`): the images gone,
blank, another patient's or mirrored; an instruction planted in one slice's pixels, the note or
a prior report in the record; a benign caption. ``make_variant`` makes one (the source case never
changes) with its :class:`CaseVariant` record (what was planted and where, what an unaffected
answer is, the sha256 of every image sent). The side-word rule a mirror applies to the note,
record and truth is one place: ``mirror_side_words``.
"""

import lazy_loader

# Names load on first use (lazy_loader); the list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
