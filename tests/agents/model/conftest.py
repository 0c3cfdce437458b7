"""Fixtures: the tiny fp32 CPU model shared by this suite's tests."""

import pytest

from agents.model import LlamaModel
from tests.agents.model.helpers import tiny_cpu_model


@pytest.fixture(scope="session")
def tiny_model() -> LlamaModel:
    return tiny_cpu_model()
