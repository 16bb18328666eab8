"""Every experiment: simulated and live comparisons, sweeps and demos.

Experiments compose the library; nothing in the library imports them. Each
result says which world graded it.
"""
