"""From a plan to tensors: collation (``collate``), context-parallel cuts (``context_parallel``), the
``Loader`` (``loader``) and its worker and transfers (``pipeline``), reusable host blocks (``blocks``).
Stands on ``planning``, ``data`` and ``base``."""
