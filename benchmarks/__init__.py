"""The policy benchmark: ``python -m benchmarks`` (see __main__.py).

workloads.py and trace.py make the requests, bids.py their bids, runner.py serves them on the
simulated engine in virtual time, metrics.py measures, sweep.py compares the policies across load
and sharing, report.py and html.py present the results.
"""
