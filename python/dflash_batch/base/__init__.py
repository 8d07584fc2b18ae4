"""The ground floor every wing stands on: errors raised from Python (``errors``), argument checks
(``arguments``), where ranks come from (``ranks``) and the one owner of background threads and exit and
fork hooks (``runtime``). Imports nothing of the package but ``_core``."""
