"""Reports: per-case checklists, the run summary with plots, PDFs, and the clinician review log.

Build from a run (``load_run`` or a ``RunData`` made by hand), then ``write_report`` writes
everything; the gateway's review pages (``gateway.api.routers.review``) serve the same pages
with review controls. The pieces: ``build_checklist`` (one case), ``build_summary`` (the run,
with signed-off reviews fed back), ``render_checklist``/``render_summary`` (HTML),
``html_to_pdf`` (Chromium), ``ReviewStore`` (append-only log). The pilot report for a governance
board over a pilot's runs: ``pilot_run``/``build_pilot``, ``write_pilot`` (``pilot.py``).
"""

import lazy_loader

# Names load on first use: importing one submodule (a worker process, a header read) does not
# import the package. The list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
