"""The Query Router's SLO margin calibration, now in :mod:`sloctl.models.calibration`.

It moved down a layer so that the registry, which builds routers
(:func:`sloctl.registry.routers.build_router`), can calibrate on a log when an
older model bundle carries no margin. This module keeps the old import path.
"""

from __future__ import annotations

from sloctl.models.calibration import MarginCalibration, arrival_time_ratios, calibrate_slo_margin

__all__ = ["MarginCalibration", "arrival_time_ratios", "calibrate_slo_margin"]
