"""What a person runs beside training: the ``dflash-batch`` command (``cli``), the analysis of a plan
(``analyze``), the baselines it is measured against (``baselines``, ``metrics``) and the writers of the
docs' generated tables (``docs``). Nothing of training imports this wing."""
