"""Shared pieces of the runtime tests: settings, a cheap cost model, a migrated database."""

import pytest

from backend.db.session import create_db_engine, create_session_factory, run_migrations
from backend.policy import CostModel
from backend.policy.cost_model import DecodeFit, LinkModel, PrefillFit
from backend.settings.conductor import ConductorSettings

SECRET = "runtime-test-secret-0123"
BLOCK = 64
COST = CostModel(
    PrefillFit(0.01, 1e-4), DecodeFit(0.005, 1e-4, 1e-7), LinkModel(1e8, 1e-3), 4096, "tiny"
)


def make_settings(**overrides: object) -> ConductorSettings:
    values: dict[str, object] = {
        "agent_secret": SECRET,
        "admin_token": "admin-token-0123456789",
        "api_keys": [{"name": "test", "key": "api-key-0123456789"}],
        "block_size": BLOCK,
        "heartbeat_interval_s": 0.2,
        "heartbeat_timeout_s": 3.0,
        **overrides,
    }
    return ConductorSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def sessions(tmp_path):
    url = f"sqlite:///{tmp_path / 'runtime.db'}"
    run_migrations(url)
    engine = create_db_engine(url)
    yield create_session_factory(engine)
    engine.dispose()
