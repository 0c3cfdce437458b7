"""The layer-wise schedule: load l+1 starts before layer l computes; stores wait only at the end."""

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from agents.workers import BlockSink, BlockSource, PrefillWorker
from tests.agents.model.helpers import BLOCK_SIZE, prompt

STORE_GATE_TIMEOUT_S = 60.0


class RecordingSource(BlockSource):
    def __init__(self, blocks, events):
        super().__init__(blocks)
        self.events = events

    def start_load(self, layer):
        self.events.append(("load_start", layer))
        handle = super().start_load(layer)
        handle.layer = layer
        return handle

    def wait(self, handle):
        self.events.append(("load_wait", handle.layer))
        return super().wait(handle)


class GatedSink(BlockSink):
    """Stores run on a thread but only once wait_all opens the gate: a worker that waited
    for a store inside the layer loop would see it time out. The timeout is long enough
    for a starved CI machine to compute every layer before wait_all (5 s was not), and
    bounds the failing case."""

    def __init__(self, num_layers, events, executor):
        super().__init__(num_layers, BLOCK_SIZE, executor=executor)
        self.events = events
        self.gate = threading.Event()
        self.ran_before_wait_all = []

    def start_store(self, layer, k, v) -> Future:
        self.events.append(("store_start", layer))
        return super().start_store(layer, k, v)

    def _store(self, layer, k, v):
        self.ran_before_wait_all.append(not self.gate.wait(timeout=STORE_GATE_TIMEOUT_S))
        super()._store(layer, k, v)

    def wait_all(self):
        self.events.append(("wait_all", -1))
        self.gate.set()
        return super().wait_all()


def test_hooks_run_in_the_documented_order(tiny_model):
    worker = PrefillWorker(tiny_model, BLOCK_SIZE)
    tokens = prompt(100, seed=21)
    earlier = worker.prefill(tokens)
    events: list[tuple[str, int]] = []
    num_layers = tiny_model.config.num_layers
    with ThreadPoolExecutor(num_layers) as pool:
        source = RecordingSource(earlier.new_blocks[:2], events)
        sink = GatedSink(num_layers, events, pool)
        result = worker.prefill(
            tokens,
            source=source,
            sink=sink,
            on_layer=lambda layer: events.append(("compute", layer)),
        )
    expected = [("load_start", 0)]
    for layer in range(num_layers):
        expected.append(("load_wait", layer))
        if layer + 1 < num_layers:
            expected.append(("load_start", layer + 1))
        expected += [("compute", layer), ("store_start", layer)]
    expected.append(("wait_all", -1))
    assert events == expected
    assert sink.ran_before_wait_all == [False] * num_layers
    assert torch.allclose(result.logits, earlier.logits, atol=1e-4, rtol=0)
    for mine, theirs in zip(result.new_blocks, earlier.new_blocks[2:], strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)
