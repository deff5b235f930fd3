"""One library function per CLI command, what advisor.cli calls: recommend, estimate_request /
recsys_request (advisor estimate), execute (the reference executor against the prediction), and
inputs (command-line values -> specs, shared by them all). cli_options and cli_run are the parts of
the typer app split out of advisor/cli.py (consoles and shared option help; the execute and
calibrate command bodies). advisor.whatif and advisor.calibrate stay at the top level (DESIGN.md
"Layout").
"""
