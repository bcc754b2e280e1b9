"""The gateway's review: the queue of runs to review (``queue``), a reviewer's actions and their
rules (``actions``), sign-off and re-issue as a VERIFIED SR (``reissue``), the service the
routers call (``service``) and who may review (``auth``). The routers are
``gateway.api.routers.review`` (pages) and ``review_api`` (JSON)."""
