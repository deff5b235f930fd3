"""The output layer: rich tables and plots of what the commands computed (DESIGN.md "Data flow":
rank -> report). report/report_recsys draw a recommendation, breakdown an estimate, listing the
bundled models and profiles, plots the recommend/what-if charts, formatting the shared number
formats. Only advisor.cli, advisor.commands and advisor.whatif import this package; nothing here
computes a plan or an estimate.
"""
