"""The calibration's one row: save after a refit, load at start (keyword-only, as the rest)."""

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db.models import CalibrationRow

_ROW_ID = 1


def save_calibration(*, session: Session, state: dict[str, Any], now_s: float) -> None:
    row = session.get(CalibrationRow, _ROW_ID)
    if row is None:
        session.add(CalibrationRow(id=_ROW_ID, updated_time_s=now_s, state=state))
    else:
        row.updated_time_s, row.state = now_s, state
    session.commit()


def load_calibration(*, session: Session) -> tuple[dict[str, Any], float] | None:
    """(state, when it was saved), or None when nothing was saved yet."""
    row = session.scalar(select(CalibrationRow).where(CalibrationRow.id == _ROW_ID))
    return (row.state, row.updated_time_s) if row is not None else None
