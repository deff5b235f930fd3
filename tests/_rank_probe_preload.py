"""Imported by the rank starter before it forks tests/_rank_probe.py's ranks (its PRELOAD): the pid that imported it."""

import os
import time

IMPORTED_BY = os.getpid()
time.sleep(float(os.environ.get("PROBE_PRELOAD_SLEEP_S", "0")))     # a starter slow to import (a loaded machine)
