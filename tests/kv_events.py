"""Feed KV events into a PrefixIndex exactly as the Conductor core does (shared by tests)."""

from collections.abc import Iterable

from backend.policy import PrefixIndex
from backend.policy.events import KvDemoted, KvEvicted, KvStored


def replay_kv_events(index: PrefixIndex, events: Iterable[object]) -> None:
    for event in events:
        if isinstance(event, KvStored):
            index.on_stored(event.instance_id, event.keys, event.tier)
        elif isinstance(event, KvEvicted):
            index.on_evicted(event.instance_id, event.keys)
        elif isinstance(event, KvDemoted):
            index.on_demoted(event.instance_id, event.keys)
        else:
            raise AssertionError(f"not a KV event: {event!r}")
