"""CalibrationFeed: the agents' measurements into the Conductor's online calibration.

Each heartbeat carries the prefills and decode steps its agent measured, and its host's CPU
counters; they go into the `Calibrator`'s rolling window, on the Conductor's clock. When a
refit is due and `calibrate` is on, the core believes the refitted cost model from the next
event on, and the new state is exported as metrics and saved, so it survives a Conductor
restart.
"""

import dataclasses
import logging
import math

from sqlalchemy.orm import Session, sessionmaker

from backend.db import calibration_store
from backend.policy.calibration import Calibrator
from backend.rpc.reports import Heartbeat
from backend.runtime.state import AfterWork, RuntimeState

logger = logging.getLogger(__name__)

UNSOUND_LOG_INTERVAL_S = 60.0


class CalibrationFeed:
    """Feeds `calibrator` from heartbeats; `calibrate` off: measured, never applied."""

    def __init__(
        self,
        state: RuntimeState,
        calibrator: Calibrator,
        *,
        calibrate: bool,
        session_factory: sessionmaker[Session] | None,
    ) -> None:
        self._state = state
        self.calibrator = calibrator
        self.calibrate = calibrate
        self._sessions = session_factory
        # Measurements an agent sent that cannot be measurements (`is_sound`), by agent, and
        # when that was last logged: dropped one by one, logged at most once a minute each.
        self.num_unsound: dict[str, int] = {}
        self._unsound_logged_s: dict[str, float] = {}

    def on_heartbeat(self, heartbeat: Heartbeat, now_s: float, clock_offset_s: float) -> AfterWork:
        """Take the agent's measurements into the window; refit when due (lock held: the
        core believes the new model from the next event on). Returns the export and saving
        of the new state, to do after the lock."""
        calibrator = self.calibrator
        prefill = [s for s in heartbeat.prefill_samples if s.is_sound()]
        decode = [s for s in heartbeat.decode_steps if s.is_sound()]
        host_cpu = heartbeat.host_cpu
        if host_cpu is not None and not host_cpu.is_sound():
            host_cpu = None
        self._note_unsound(heartbeat, len(prefill), len(decode), host_cpu, now_s)
        # Onto our clock: when each ended matters (host sharing reads how they overlapped).
        calibrator.add_prefill(
            dataclasses.replace(sample, time_s=min(now_s, sample.time_s + clock_offset_s))
            for sample in prefill
        )
        calibrator.add_decode(
            dataclasses.replace(sample, time_s=min(now_s, sample.time_s + clock_offset_s))
            for sample in decode
        )
        if host_cpu is not None:
            calibrator.add_host_cpu(
                [dataclasses.replace(host_cpu, time_s=min(now_s, host_cpu.time_s + clock_offset_s))]
            )
        if not (self.calibrate and calibrator.is_due(now_s)):
            return []
        core = self._state.core
        before = core.cost
        refit = calibrator.refit(now_s)
        if refit.cost == before:
            return []
        core.recost(refit.cost)
        logger.info(
            "calibration: refitted %s (prefill %s, decode %s, serving %s)%s",
            ", ".join(refit.updated) or "nothing",
            refit.cost.prefill, refit.cost.decode, refit.cost.serving,
            f"; {'; '.join(refit.notes)}" if refit.notes else "",
        )  # fmt: skip
        work: AfterWork = []
        if self._state.metrics is not None:
            work.append(lambda snapshot=calibrator.snapshot(): self._export(snapshot))
        if self._sessions is not None:
            saved = calibrator.to_state()
            work.append(lambda: self._save(saved, now_s))
        return work

    def _note_unsound(
        self,
        heartbeat: Heartbeat,
        num_prefill: int,
        num_decode: int,
        host_cpu: object | None,
        now_s: float,
    ) -> None:
        dropped = (
            len(heartbeat.prefill_samples) - num_prefill
            + len(heartbeat.decode_steps) - num_decode
            + (heartbeat.host_cpu is not None and host_cpu is None)
        )  # fmt: skip
        if not dropped:
            return
        agent = heartbeat.instance_id
        self.num_unsound[agent] = self.num_unsound.get(agent, 0) + dropped
        if now_s - self._unsound_logged_s.get(agent, -math.inf) >= UNSOUND_LOG_INTERVAL_S:
            self._unsound_logged_s[agent] = now_s
            logger.warning(
                "calibration: dropped %d measurement(s) from %s that cannot be right (negative "
                "or non-finite times, cached tokens beyond the input, busy beyond total CPU); "
                "%d so far",
                dropped, agent, self.num_unsound[agent],
            )  # fmt: skip

    def _export(self, snapshot: Calibrator) -> None:
        residuals = snapshot.residuals()
        self._state.metrics.set_calibration(  # type: ignore[union-attr]
            snapshot.num_refits,
            residuals["prefill_median_rel_err"],
            residuals["decode_median_rel_err"],
        )

    def _save(self, saved: dict, now_s: float) -> None:
        try:
            with self._sessions() as session:  # type: ignore[misc]
                calibration_store.save_calibration(session=session, state=saved, now_s=now_s)
        except Exception:  # a failing database must not stop heartbeats
            logger.exception("calibration: could not save the refitted model")

    def restore(self) -> None:
        """Resume the calibration saved before a restart (its model and window)."""
        if self._sessions is None:
            return
        with self._sessions() as session:
            saved = calibration_store.load_calibration(session=session)
        if saved is None:
            return
        saved_state, saved_s = saved
        try:
            self.calibrator.restore(saved_state)
        except ValueError as error:
            logger.warning("calibration: the saved state is not usable (%s); starting over", error)
            return
        if self.calibrate:
            self._state.core.recost(self.calibrator.cost)
        logger.info(
            "calibration: resumed the model saved at %.0f (%d refits before): %s",
            saved_s, self.calibrator.num_refits, self.calibrator.cost.name,
        )  # fmt: skip
