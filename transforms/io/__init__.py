"""Storage: input formats, files on any filesystem, one-writer leases, create-if-absent
writes, scratch files written as data, and the names of every file a run makes
(``layout``). Plain functions, no Beam at import (Beam's FileSystems on first use for
remote paths)."""
