"""Imported by the rank starter before it forks tests/_rank_probe.py's ranks (its PRELOAD): the pid that imported it."""

import os

IMPORTED_BY = os.getpid()
