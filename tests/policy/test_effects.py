"""The one contract drivers carry effects out through: every kind reaches its method."""

import typing

import pytest

from backend.policy.effects import (
    CachePlan,
    DispatchDecode,
    DispatchPrefill,
    Effect,
    EffectHandler,
    Evict,
    FailRequest,
    Reject,
    Replicate,
    carry_out,
)


class Recorder(EffectHandler):
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_dispatch_prefill(self, effect, *, replicate):
        self.calls.append(("dispatch_prefill", replicate))

    def on_replicate(self, effect):
        self.calls.append(("replicate", effect.keys))

    def on_dispatch_decode(self, effect):
        self.calls.append(("dispatch_decode", effect.instance_id))

    def on_reject(self, effect):
        self.calls.append(("reject", effect.reason))

    def on_fail(self, effect):
        self.calls.append(("fail", effect.reason))

    def on_evict(self, effect):
        self.calls.append(("evict", effect.keys))


def test_every_kind_reaches_its_method_in_order_and_a_prefill_knows_its_replicate() -> None:
    plan = CachePlan((), None, 0, 10)
    effects = [
        DispatchPrefill("a", "P1", "D1", plan, 0.0, 0.0, 0.1, 0.1, ()),
        Replicate("a", "P2", "P1", (5,)),
        DispatchPrefill("b", "P1", "D1", plan, 0.0, 0.0, 0.1, 0.1, ()),
        DispatchDecode("c", "D1", 10),
        Reject("d", "ttft_slo", "admission", "too slow", 1.0),
        FailRequest("e", "lost"),
        Evict("P1", (7,)),
    ]
    assert {type(e) for e in effects} == set(typing.get_args(Effect))  # every kind is here
    handler = Recorder()
    carry_out(handler, effects)
    assert handler.calls == [
        ("dispatch_prefill", True),
        ("replicate", (5,)),
        ("dispatch_prefill", False),
        ("dispatch_decode", "D1"),
        ("reject", "ttft_slo"),
        ("fail", "lost"),
        ("evict", (7,)),
    ]


def test_a_driver_that_forgets_a_kind_cannot_be_built() -> None:
    class Forgetful(Recorder):
        on_evict = EffectHandler.on_evict  # back to the abstract method

    Forgetful.__abstractmethods__ = frozenset({"on_evict"})
    with pytest.raises(TypeError, match="on_evict"):
        Forgetful()
