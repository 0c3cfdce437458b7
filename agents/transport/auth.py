"""Mutual authentication of data-plane peers: HMAC-SHA256 challenge-response on connect.

Each side sends a fresh random nonce and proves it holds the shared secret by returning
HMAC(secret, role || their nonce || our nonce); the role labels differ, so a proof cannot
be reflected back. The server speaks first and answers a failed proof with a refusal byte
before closing, so an honest client with the wrong secret gets a clear error. This
authenticates the peer at connect; it neither encrypts nor signs the frames that follow.
"""

import hashlib
import hmac
import os
import socket

from agents.transport.errors import AuthenticationError, TransportError
from agents.transport.wire import recv_exact

HELLO = b"KVTAUTH1"
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
_ACCEPTED, _REFUSED = b"\x01", b"\x00"


def as_secret(secret: bytes | str | None) -> bytes:
    """The shared secret as bytes; an empty or missing secret is refused outright."""
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret:
        raise ValueError("the data plane needs a non-empty shared secret")
    return bytes(secret)


def _proof(secret: bytes, role: bytes, theirs: bytes, ours: bytes) -> bytes:
    return hmac.new(secret, role + theirs + ours, hashlib.sha256).digest()


def accept_peer(sock: socket.socket, secret: bytes, peer: str) -> None:
    """Server side: challenge the connecting peer; AuthenticationError if it fails."""
    server_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(HELLO + server_nonce)
    try:
        answer = recv_exact(sock, NONCE_BYTES + PROOF_BYTES, peer, "the authentication answer")
    except TransportError as exc:
        raise AuthenticationError(peer, f"did not authenticate: {exc.message}") from None
    client_nonce, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _proof(secret, b"client", server_nonce, client_nonce)):
        sock.sendall(_REFUSED)
        raise AuthenticationError(peer, "failed to prove it holds the shared secret; refused")
    sock.sendall(_ACCEPTED + _proof(secret, b"server", client_nonce, server_nonce))


def join_peer(sock: socket.socket, secret: bytes, peer: str) -> None:
    """Client side: answer the server's challenge and check the server's own proof."""
    hello = recv_exact(sock, len(HELLO) + NONCE_BYTES, peer, "the authentication challenge")
    if not hello.startswith(HELLO):
        raise AuthenticationError(peer, "is not a kvcentric data-plane server (bad greeting)")
    server_nonce = hello[len(HELLO) :]
    client_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(client_nonce + _proof(secret, b"client", server_nonce, client_nonce))
    try:
        verdict = recv_exact(sock, 1, peer, "the authentication verdict")
    except TransportError:
        verdict = _REFUSED
    if verdict != _ACCEPTED:
        raise AuthenticationError(peer, "refused our credentials (wrong shared secret?)")
    proof = recv_exact(sock, PROOF_BYTES, peer, "the server's proof")
    if not hmac.compare_digest(proof, _proof(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError(peer, "failed to prove it holds the shared secret")
