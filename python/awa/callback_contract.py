"""The HTTP callback ingress contract: sign and check callback ids, build receiver URLs.

The same names and format as awa-pg 0.6.9's ``awa.callback_contract``. A signature is the
lowercase hex of the BLAKE3 keyed hash of the callback id under a 32-byte secret, carried in
the ``X-Awa-Signature`` header; ``awa callbacks serve`` checks exactly this, and a signature
made by awa-pg's workers or clients verifies here (and the other way round). The work is done
by the native module (``awa_core::callback_contract``), shared with the server.

Use it when the receiver routes live in your own web framework::

    import os
    from awa import callback_contract

    secret = bytes.fromhex(os.environ["AWA_CALLBACK_SECRET"])  # 32 bytes

    def accept(callback_id: str, headers) -> bool:
        given = headers.get(callback_contract.SIGNATURE_HEADER, "")
        return callback_contract.verify(secret, callback_id, given)

``sign`` and ``verify`` raise ``awa.ValidationError`` (also a ``ValueError``) for a secret
that is not exactly 32 bytes, and ``TypeError`` for a secret that is not ``bytes``. ``verify``
is ``False``, never an error, for a signature that is not 64 hex characters. See
docs/callbacks.md, "Signed callbacks".
"""

from __future__ import annotations

from ._awa import (
    CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS,
    CALLBACK_DEFAULT_PATH_PREFIX,
    CALLBACK_SIGNATURE_HEADER,
    build_callback_url,
)
from ._awa import sign_callback as sign
from ._awa import verify_callback as verify

#: The request header that carries the signature: ``"X-Awa-Signature"``.
SIGNATURE_HEADER: str = CALLBACK_SIGNATURE_HEADER
#: Where the receiver routes live by default: ``"/api/callbacks"``.
DEFAULT_PATH_PREFIX: str = CALLBACK_DEFAULT_PATH_PREFIX
#: The callback timeout a heartbeat extends to by default, in seconds (3600.0).
DEFAULT_HEARTBEAT_TIMEOUT_SECS: float = CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_SECS",
    "DEFAULT_PATH_PREFIX",
    "SIGNATURE_HEADER",
    "build_callback_url",
    "sign",
    "verify",
]
