"""Process plumbing every stage shares: signals (Ctrl-C, SIGTERM, torch elastic's), the run folder's files,
parent-death (no process outlives its parent), log files, and CPU cores (slices for concurrent jobs,
one per worker). Imports only ``config``; any stage may import it."""
