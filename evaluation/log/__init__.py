"""The run log: one store per install or per run, its schema and migrations, its typed records.

``RunStore`` is the store (SQLAlchemy Core over SQLite, one file per run, or PostgreSQL, every run
of an install keyed by run id); ``records`` holds what it hands back (``RunLog``,
``SampleRecord``, ``GatewayRun``...). Nothing here reads the environment: the caller passes the
database URL (the gateway's settings).
"""

import lazy_loader

# Names load on first use (lazy_loader); the list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
