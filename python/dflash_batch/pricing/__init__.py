"""What a batch costs: the price model and its measurement (``cost``), the robust fit of step times
(``price_fit``), calibration while training (``calibration``) and losses by source (``per_source``).
Stands on ``base`` only: a price reaches a plan as a setting."""
