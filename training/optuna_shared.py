"""What lets several workers share one Optuna study: a sampler seeded per trial, a storage opened safely.

A seeded ``TPESampler`` draws from one random stream per process: two
workers started with the same seed on one shared study (``sloctl tune ...
--storage postgresql://...`` twice) replay the same stream and evaluate the
same parameters in pairs. :class:`TrialSeededSampler` gives every trial its
own sampler, seeded from ``(seed, trial number, trial id)``; the storage hands
out trial ids (and numbers) once each, so no two trials of a study share a
stream, whichever worker runs them, while one worker on a fresh storage
still repeats exactly for a seed. Resuming a study continues with new trial
numbers, hence fresh streams. The TPE samplers use ``constant_liar`` (Optuna's
own help for parallel workers: trials still running count as bad results, so
workers do not crowd the same region).

:func:`open_storage` opens a server-backed storage (``postgresql://``,
``mysql+pymysql://``): workers started at the same moment on an empty
database race to create Optuna's tables, and the loser's ``CREATE`` fails; it
retries, and then finds the tables made. SQLAlchemy picks the driver
(psycopg 3 for ``postgresql://``, installed by ``pip install 'sloctl[postgres]'``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna

__all__ = ["TrialSeededSampler", "open_storage", "trial_seed"]


def trial_seed(seed: int, number: int, trial_id: int) -> int:
    """The sampler seed of one trial (an unsigned 32-bit integer)."""
    return int(np.random.SeedSequence([seed, number, trial_id]).generate_state(1)[0])


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """Delegates each trial to a fresh sampler ``make(trial_seed(seed, number, trial id))`` (default: TPE)."""

    def __init__(self, seed: int = 0, make: Callable[[int], optuna.samplers.BaseSampler] = _tpe) -> None:
        self.seed = int(seed)
        self._make = make
        self._samplers: dict[int, optuna.samplers.BaseSampler] = {}
        self._lock = threading.Lock()

    def _of(self, trial: Any) -> optuna.samplers.BaseSampler:
        with self._lock:
            sampler = self._samplers.get(trial._trial_id)
            if sampler is None:
                sampler = self._make(trial_seed(self.seed, trial.number, trial._trial_id))
                self._samplers[trial._trial_id] = sampler
            return sampler

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        return self._of(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
        return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Any, trial: Any) -> None:
        self._of(trial).before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Sequence[float] | None) -> None:
        sampler = self._of(trial)
        with self._lock:
            self._samplers.pop(trial._trial_id, None)
        sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:  # every trial is seeded already (Optuna calls this for n_jobs > 1)
        pass


def open_storage(url: str, *, attempts: int = 5) -> str | optuna.storages.BaseStorage:
    """An Optuna storage for ``url``: SQLite and in-memory URLs as they are, server databases as ``RDBStorage``.

    A server database is opened with connection checks (``pool_pre_ping``) and up to ``attempts`` tries, so
    workers that create the schema at the same moment all succeed.
    """
    if url.startswith("sqlite") or "://" not in url:
        return url
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):  # another worker made the schema
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")
