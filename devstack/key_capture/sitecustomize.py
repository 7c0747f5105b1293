"""Loaded by a test worker's interpreter at start (``start_worker(...,
capture_keys=...)`` puts this directory first on PYTHONPATH): every EC and RSA
private key the process generates is appended, as PKCS#8 DER in hex, to the file
``DEVSTACK_KEY_CAPTURE`` names, so a leak test can search for keys that were
generated, used and replaced. Test harness only: nothing of the product knows.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_PATH = os.environ.get("DEVSTACK_KEY_CAPTURE")

if _PATH:
    _CAPTURE: str = _PATH
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    _lock = threading.Lock()

    def _captured(key: Any) -> Any:
        der = key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with _lock, open(_CAPTURE, "a", encoding="ascii") as out:
            out.write(der.hex() + "\n")
        return key

    _ec_generate = ec.generate_private_key
    _rsa_generate = rsa.generate_private_key

    def _generate_ec(curve: Any, backend: Any = None) -> Any:
        return _captured(_ec_generate(curve, backend))

    def _generate_rsa(public_exponent: int, key_size: int, backend: Any = None) -> Any:
        return _captured(_rsa_generate(public_exponent, key_size, backend))

    ec.generate_private_key = _generate_ec
    rsa.generate_private_key = _generate_rsa
