"""MooncakeEngine: the few Mooncake Transfer Engine calls our data plane makes, and their checks.

The engine runs its TCP protocol with P2P handshake (no metadata server): a peer is named
by its session "host:rpc_port". Every transfer is submitted with the asynchronous batch
call and polled with `transfer_check_status`, sleeping between polls; the synchronous calls
and `get_batch_transfer_status` busy-wait a core until the transfer ends. The poll reads
the state of the batch's first task only, so each transfer is one batch of one task.
Caution, as of mooncake-transfer-engine 0.3.13: the engine's handshake and data ports
listen on every interface whatever host it is given, and its data port serves registered
memory to any peer without authentication, so only staging buffers are ever registered.
"""

import functools
import time

import numpy as np

from agents.transport.base import format_address
from agents.transport.errors import TransportError

_FIRST_POLL_DELAY_S = 20e-6
_MAX_POLL_DELAY_S = 1e-3


@functools.cache
def mooncake_missing_reason() -> str | None:
    """Why the Mooncake Transfer Engine cannot be used here, or None if it can."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:
        return (
            f"mooncake-transfer-engine is not importable ({exc}); install "
            "mooncake-transfer-engine (CUDA) or mooncake-transfer-engine-non-cuda, "
            "which needs the system library libibverbs1"
        )
    return None


class MooncakeEngine:
    """One Transfer Engine on `host`; registers staging buffers and moves them to peers."""

    def __init__(self, host: str) -> None:
        reason = mooncake_missing_reason()
        if reason:
            raise TransportError(None, reason)
        from mooncake.engine import TransferEngine

        self._engine = TransferEngine()
        rc = self._engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise TransportError(None, f"Mooncake Transfer Engine did not start on {host} ({rc})")
        self.session = format_address(host, self._engine.get_rpc_port())
        self._abandoned: list[np.ndarray] = []  # buffers of timed-out transfers, never reused

    def register(self, buffer: np.ndarray) -> int:
        """Expose `buffer` (uint8, contiguous) to peers' transfers; returns its address."""
        address = buffer.ctypes.data
        if self._engine.register_memory(address, buffer.nbytes) != 0:
            raise TransportError(None, f"Mooncake could not register {buffer.nbytes} bytes")
        return address

    def unregister(self, buffer: np.ndarray) -> None:
        self._engine.unregister_memory(buffer.ctypes.data)

    def transfer(
        self,
        is_read: bool,
        peer: str,
        session: str,
        local: np.ndarray,
        remote_address: int,
        timeout_s: float,
    ) -> None:
        """Read `local.nbytes` bytes at `remote_address` of `session` into `local`, or write.

        `peer` only names the peer in errors. On a timeout `local` is kept forever: the
        engine cannot cancel a transfer and may still write into it.
        """
        engine = self._engine
        submit = engine.batch_transfer_async_read if is_read else engine.batch_transfer_async_write
        what = f"Mooncake transfer of {local.nbytes} bytes with session {session}"
        batch_id = submit(session, [local.ctypes.data], [remote_address], [local.nbytes])
        if not 0 < batch_id < 1 << 63:  # 0, or -1 wrapped to an unsigned id, means refused
            raise TransportError(peer, f"{what} could not be submitted (returned {batch_id})")
        deadline_s = time.monotonic() + timeout_s
        delay_s = _FIRST_POLL_DELAY_S
        while (status := self._engine.transfer_check_status(batch_id)) == 0:
            if time.monotonic() > deadline_s:
                status = -2
                break
            time.sleep(delay_s)
            delay_s = min(2 * delay_s, _MAX_POLL_DELAY_S)
        if status == 1:
            return
        if status == -2:
            self._abandoned.append(local)  # the engine may still write into it
            raise TransportError(peer, f"{what} timed out after {timeout_s} s")
        raise TransportError(peer, f"{what} failed (status {status})")
