"""Build the Query Router for a latency model: one function for every driver (AutoSLO §5).

``sloctl serve`` (:class:`~sloctl.serving.runtime.Runtime`) and the CLI's
experiments (``sloctl experiment router|sizer|trigger``, the demo) build their
router here, so that the same model and the same ``router:`` settings give the
same router: the same SLO margin, cost tolerance and template table, hence the
same decisions. The model bundle carries the margin calibrated on its training
log and its template table (:mod:`sloctl.registry.bundles`); what this module
adds is the order in which the sources count, written down once in
:func:`build_router`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sloctl.control.router import IconqRouter, RoundRobinRouter, RouterGuard, StageCostRouter
from sloctl.core.kinds import RouterKind
from sloctl.models.calibration import MarginCalibration, calibrate_slo_margin
from sloctl.models.online import OnlinePredictor

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import RouterSection
    from sloctl.models.predictor import LatencyPredictor

__all__ = ["DEFAULT_SLO_MARGIN", "BuiltRouter", "MarginChoice", "build_router", "resolve_slo_margin",
           "router_guard", "router_templates", "violation_spread"]

#: The margin used when neither the config, the model bundle nor a log gives one (with a warning):
#: the value the runtime hard-coded before bundles carried a calibrated margin.
DEFAULT_SLO_MARGIN = 0.3

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MarginChoice:
    """The Query Router's SLO margin and where it came from.

    Attributes:
        slo_margin: count a query as violating once its predicted latency
            exceeds ``(1 − slo_margin) × SLO``.
        source: ``"config"``, ``"bundle"``, ``"calibrated"`` (on a log given
            now) or ``"default"``.
        calibration: the figures behind a bundle's or a calibrated margin.
    """

    slo_margin: float
    source: str
    calibration: MarginCalibration | None = None


@dataclass(frozen=True, eq=False)
class BuiltRouter:
    """A router ready to route, with the settings it was built from.

    Attributes:
        router: ``IconqRouter``, ``StageCostRouter`` or ``RoundRobinRouter``.
        online: the router's :class:`~sloctl.models.online.OnlinePredictor`
            (``None`` for round-robin).
        kind: ``"iconq"``, ``"stage"`` or ``"round-robin"``.
        margin: the SLO margin and its source (``None`` unless ``kind`` is
            ``"iconq"``: only the Iconq+ router uses one).
        cost_tolerance: ``router.cost_tolerance`` (the Iconq+ router's).
        templates: the template table routed with (``None`` for round-robin).
        guard: the Iconq+ router's :class:`~sloctl.control.router.RouterGuard`
            (``None``: off, or not an Iconq+ router).
        violation_spread: the Iconq+ router's soft-count spread ``σ`` (0: hard
            counts, see :func:`violation_spread`).
    """

    router: Any
    online: OnlinePredictor | None
    kind: RouterKind
    margin: MarginChoice | None
    cost_tolerance: float
    templates: pd.DataFrame | None
    guard: RouterGuard | None = None
    violation_spread: float = 0.0

    @property
    def slo_margin(self) -> float | None:
        return None if self.margin is None else self.margin.slo_margin


def router_templates(predictor: LatencyPredictor | None, templates: pd.DataFrame | None = None
                     ) -> pd.DataFrame | None:
    """The template table to route with: ``templates`` if given (``serve.templates_log``), else the bundle's.

    Templates whose features the model cannot use (a whole group it was
    trained on is unknown, e.g. plan features for a model of a log imported
    from another engine) are left out, so the router treats them as unknown
    templates instead of predicting from features it never saw.

    Raises:
        FeatureError: no template of ``templates`` has the features the model needs.
    """
    table = templates if templates is not None else (None if predictor is None else predictor.templates)
    if table is None or predictor is None or not len(table):
        return table
    missing = predictor.missing_features(table)
    if not missing:
        return table
    bad = sorted({int(r) for rows in missing.values() for r in rows})
    if len(bad) == len(table):
        predictor.check_features(table, what="the router's template table")
    _log.warning("%d of %d template(s) lack features the model needs (%s); they are routed as unknown templates",
                 len(bad), len(table), ", ".join(missing))
    return table.drop(index=table.index[bad]).reset_index(drop=True)


def resolve_slo_margin(predictor: LatencyPredictor, router: RouterSection, *, log: pd.DataFrame | None = None,
                       say: Callable[[str], None] | None = None) -> MarginChoice:
    """The Iconq+ router's SLO margin, by the precedence documented in :func:`build_router`."""
    say = say or _log.info
    if router.slo_margin is not None:
        return MarginChoice(router.slo_margin, "config")
    if predictor.calibration is not None:
        calibration = predictor.calibration
        say(f"{calibration.describe()}; from the model bundle (calibrated on its training log)")
        return MarginChoice(calibration.slo_margin, "bundle", calibration)
    if log is not None:
        calibration = calibrate_slo_margin(predictor, log, router.risk_quantile)
        say(calibration.describe())
        return MarginChoice(calibration.slo_margin, "calibrated", calibration)
    warnings.warn(f"The router's SLO margin is not set (router.slo_margin is null), the model bundle carries none "
                  f"(it was saved by an older sloctl) and no log was given to calibrate one on; using the default "
                  f"{DEFAULT_SLO_MARGIN}. Retrain the model or set router.slo_margin.", UserWarning, stacklevel=3)
    return MarginChoice(DEFAULT_SLO_MARGIN, "default")


def router_guard(predictor: LatencyPredictor | None, router: RouterSection,
                 margin: MarginChoice | None = None) -> RouterGuard | None:
    """The Iconq+ router's guard under the ``router:`` settings (``None`` when ``router.guard`` is off).

    The concurrency support comes from the margin's calibration when it has
    one (a bundle's, or one calibrated on a log now), else from the model
    bundle; without either the support check is off and only the error check runs.
    """
    if not router.guard:
        return None
    support = None
    if router.guard_support:
        for calibration in (margin.calibration if margin is not None else None,
                            predictor.calibration if predictor is not None else None):
            if calibration is not None and calibration.concurrency_support:
                support = dict(calibration.concurrency_support)
                break
    return RouterGuard(max_ratio=router.guard_max_ratio, window=router.guard_window,
                       min_samples=router.guard_min_samples, support=support, placement=router.guard_placement)


def violation_spread(predictor: LatencyPredictor | None, router: RouterSection,
                     margin: MarginChoice | None = None) -> float:
    """``σ`` of the Iconq+ router's soft violation count: from the margin's or the bundle's calibration.

    0 (hard counts, the paper's rule) when ``router.soft_violations`` is off
    or no calibration is at hand (a bundle saved by older code and no log).
    """
    if not router.soft_violations:
        return 0.0
    for calibration in (margin.calibration if margin is not None else None,
                        predictor.calibration if predictor is not None else None):
        if calibration is not None:
            return float(calibration.spread())
    return 0.0


def build_router(predictor: LatencyPredictor | None, router: RouterSection, *,
                 templates: pd.DataFrame | None = None, log: pd.DataFrame | None = None, use_iconq: bool = True,
                 say: Callable[[str], None] | None = None) -> BuiltRouter:
    """The Query Router for ``predictor`` under the ``router:`` settings.

    The Iconq+ router's SLO margin (AutoSLO §5, with the margin of
    ``docs/control.md``) comes from the first of:

    1. ``router.slo_margin`` in the config, when it is set;
    2. the margin stored in the model bundle (calibrated on the model's
       training log at ``router.risk_quantile`` when it was trained);
    3. a margin calibrated now on ``log`` at ``router.risk_quantile``, when a
       log is given (what ``sloctl experiment`` did before bundles carried a
       margin; it still does for such older bundles) — said through ``say``;
    4. :data:`DEFAULT_SLO_MARGIN` (0.3), with a warning.

    The Iconq+ router also gets the guard of :func:`router_guard` (falls
    back to load-based placement while the model is not to be trusted) and
    the soft-count spread of :func:`violation_spread`.

    The template table (plan features per template) is ``templates`` when
    given (``sloctl serve --templates-log``, the log an experiment runs on),
    else the one stored in the bundle. Without a predictor or a table the
    router is round-robin; with ``use_iconq=False`` it is the concurrency-
    unaware ``StageCostRouter`` (which uses no margin).

    Args:
        predictor: the latency model, or ``None``.
        router: the ``router:`` config section (margin, risk quantile, cost
            tolerance).
        templates: an explicit template table, overriding the bundle's.
        log: a query log to calibrate the margin on when neither the config
            nor the bundle gives one.
        use_iconq: ``False`` builds the Stage router.
        say: where to report the margin's source (default: this module's
            logger at INFO); the CLI passes its stderr printer.

    Returns:
        The router, its online predictor and the settings it uses.
    """
    table = router_templates(predictor, templates)
    if predictor is None or table is None:
        return BuiltRouter(RoundRobinRouter(), None, RouterKind.ROUND_ROBIN, None, router.cost_tolerance, table)
    if not use_iconq:
        online = OnlinePredictor(predictor, table, use_iconq=False)
        return BuiltRouter(StageCostRouter(online), online, RouterKind.STAGE, None, router.cost_tolerance, table)
    margin = resolve_slo_margin(predictor, router, log=log, say=say)
    online = OnlinePredictor(predictor, table)
    if router.drift_window_s is not None:
        from sloctl.models.drift import DriftCalibratedPredictor, DriftCalibration

        online = DriftCalibratedPredictor(online, DriftCalibration(window_s=float(router.drift_window_s),
                                                                   min_observations=router.drift_min_observations))
    guard = router_guard(predictor, router, margin)
    spread = violation_spread(predictor, router, margin)
    return BuiltRouter(IconqRouter(online, slo_margin=margin.slo_margin, cost_tolerance=router.cost_tolerance,
                                   guard=guard, violation_spread=spread, tie_break=router.tie_break),
                       online, RouterKind.ICONQ, margin, router.cost_tolerance, table, guard, spread)
