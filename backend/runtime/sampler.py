"""LoadSampler: writes every instance's load to the database at a fixed interval.

The samples are the console's pool-load time series (and the source of the oscillation
figures): prefill load as the predicted seconds of queued prefill work (T_queue), decode
load as the policy defines it (TBT over its SLO or KV memory share, the higher), memory
from the agent's last heartbeat. Each tick also refreshes the agents' heartbeat times.
"""

import logging
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from backend.db import cluster_log
from backend.db.records import LoadSample

logger = logging.getLogger(__name__)


class LoadSampler:
    """A daemon thread calling `take()` every `interval_s` and storing what it returns."""

    def __init__(
        self,
        take: Callable[[], tuple[list[LoadSample], dict[str, float]]],
        sessions: sessionmaker[Session],
        *,
        interval_s: float,
    ) -> None:
        self._take = take
        self._sessions = sessions
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def start(self) -> "LoadSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def sample_once(self) -> int:
        """Take and store one round of samples; returns how many were stored."""
        samples, heartbeats = self._take()
        with self._sessions() as session:
            for instance_id, seen_s in heartbeats.items():
                cluster_log.record_agent_heartbeat(
                    session=session, instance_id=instance_id, now_s=seen_s
                )
            return cluster_log.record_load_samples(session=session, samples=samples)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_once()
            except Exception:  # a database hiccup must not stop the series for good
                logger.exception("load sampling failed; retrying at the next tick")
