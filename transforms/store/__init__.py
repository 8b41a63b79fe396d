"""The fingerprint store: the digests (and, with near, the values) of every record kept by
earlier runs, committed atomically per run and compacted (``store``); an attempt's part
files (``parts``), lookups and stored values (``reads``), sorted digest files read by
byte ranges (``segment``)."""
