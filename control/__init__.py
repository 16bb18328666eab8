"""Decision policies shared by live and simulated runs, and the small interfaces they drive.

The cluster-pool interface they drive lives with the warehouse adapters, in
:mod:`sloctl.datasets.pool`.
"""
