"""The cost of a run before it starts, and its budget while it runs.

``estimate_run`` (``neurosandbox eval --dry-run``) counts what a run would send (calls, images,
input tokens), what it would cost by litellm's price map and how long it would take, sending
nothing; the gate (``evaluation.budget.gate``, used by the runner on every call) stops a run
with ``max_cost_usd`` before a call could pass the budget, leaving it resumable.
"""

import lazy_loader

# Names load on first use (lazy_loader); the list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
