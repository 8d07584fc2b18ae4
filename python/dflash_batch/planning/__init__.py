"""Epochs planned and the training position: the settings' declaration (``settings``), the read-only
``Schedule``, each epoch's key (``plan_key``), the ``Cursor`` that owns the position, checkpoints
(``checkpoint``), the user's face ``BucketSampler`` (``sampler``), plans shared by a machine's processes
(``plan_files``). Stands on ``data`` and ``base``."""
