"""The review: the clinician's append-only review log (``ReviewStore``), the sign-off rules
(``verify``: what a sign-off confirms, what a VERIFIED SR may say), agreement between reviewers
and with the graders (``agreement``), and the content of a model's SR (``sr_content``: each
item a reviewer reviews once, coded by ``coding``). Reports and the gateway's review pages read
these; nothing here renders a page.
"""

import lazy_loader

# Names load on first use (lazy_loader); the list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
