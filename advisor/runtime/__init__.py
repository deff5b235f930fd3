"""What advisor's commands need from the operating system, in one place: files written atomically
(files), local processes started and watched (launch, on the launcher's side; rank, on each
started process's side), the capacity of this machine (capacity), signals (signals) and progress
bars on stderr (progress).

It imports nothing of advisor but advisor.errors, so both advisor.executor and advisor.calibration
use it without importing each other's launch code.
"""
