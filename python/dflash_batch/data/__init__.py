"""Where lengths and tokens come from: files and their kinds (``sources``), reading lengths and tokens
(``reading``), the lengths cache (``lengths_cache``), mixtures of sources (``mixture``) and the seed
workload (``workload``). Stands on ``base`` only."""
