"""``awa.callback_contract``: signatures bit-identical to awa-pg 0.6.9's, ``verify``'s true and
false paths, bad input, URL building, and ``awa callbacks serve`` accepting an awa-pg
signature."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

import awa
from awa import callback_contract as cc
from awa._serve import ServeConfig

KEY_K = b"k" * 32
KEY_SEQ = bytes(range(32))
KEY_REV = bytes(range(32))[::-1]
LONG_ID = "a" * 1000
UUID_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"

# Fixed vectors computed by awa-pg 0.6.9 (awa.callback_contract.sign, the awa-pg-probe venv
# in bench/.venvs) on 2026-12-04; pasted here as literals, never recomputed by the test.
AWA_PG_VECTORS = [
    (KEY_K, "abc", "afe3d7ad8d5833d736ab4f589515187829143f7f6fea514659bd53f4eaf74d62"),
    (KEY_K, "", "1c91cb0ac62bfb3b6bfa44336d9224de2184e097577387eff41c91c831807b9c"),
    (KEY_K, UUID_ID, "1d7bf8ce0dbc76a91589eaf4bd8225c6b945fa3aa579ee558f815c1be533b5f2"),
    (KEY_K, "ünï", "ce3226cb5ae955d5711bafb916b5235fd75581506d3ab6ace42133f6b77018b5"),
    (KEY_K, LONG_ID, "81c1601a5f576ef94b2a6ac3fd210ebb4be25044c241896c99df7072a9d436bc"),
    (KEY_SEQ, "abc", "6da54495d8152f2bcba87bd7282df70901cdb66b4448ed5f4c7bd2852b8b5532"),
    (KEY_SEQ, "", "73492b19995d71cdb1e9d74decc09809eb732f1b00bc95c27cb15f9dd4d6478f"),
    (KEY_SEQ, UUID_ID, "d2d2256da9040fd70b2d7ea74b0aef6038eb1df3e5fbaaab2c6786565056c4d7"),
    (KEY_SEQ, "ünï", "53e3c955c106740d4c2eda17a647d1f65582978dab57f174660bff618833f268"),
    (KEY_SEQ, LONG_ID, "43d67fcc78e5575f4274832a8ef405a47d5b8f3b29387d16f41b9a1c278d31b8"),
    (KEY_REV, "abc", "d556196448548aba6a8abdfd753cc0a69fb50854c22cd4e15006b23d9ffb95da"),
    (KEY_REV, "", "ca296a075d3e56acedfca4706215376988e0c7c5e71f117291b89241713bf872"),
    (KEY_REV, UUID_ID, "a0bd8e7283ad3846009cff4cbce1f5ce0e5359173e902c50b21a85a3229297c7"),
    (KEY_REV, "ünï", "b7d919f4f01c89bc8a26c3e64f0f5d52da14fffc8fae593598b1470dadb0b6bc"),
    (KEY_REV, LONG_ID, "3473dd6295b837a8e22a6588c70da8690c6268a1feacfd3af432ea3dcd9c1105"),
]


@pytest.mark.parametrize(("secret", "callback_id", "expected"), AWA_PG_VECTORS)
def test_sign_is_bit_identical_to_awa_pg(secret: bytes, callback_id: str, expected: str) -> None:
    assert cc.sign(secret, callback_id) == expected
    assert cc.verify(secret, callback_id, expected) is True


def test_names_and_constants_match_awa_pg() -> None:
    assert awa.callback_contract is cc and "callback_contract" in awa.__all__
    assert sorted(cc.__all__) == sorted([
        "DEFAULT_HEARTBEAT_TIMEOUT_SECS", "DEFAULT_PATH_PREFIX", "SIGNATURE_HEADER",
        "build_callback_url", "sign", "verify"])
    assert cc.SIGNATURE_HEADER == "X-Awa-Signature"
    assert cc.DEFAULT_PATH_PREFIX == "/api/callbacks"
    assert cc.DEFAULT_HEARTBEAT_TIMEOUT_SECS == 3600.0


def test_verify_true_and_false_paths() -> None:
    good = AWA_PG_VECTORS[0][2]
    assert cc.verify(KEY_K, "abc", good.upper())  # hex of either case, as awa-pg
    for bad in ["", "zz", good[:-1], good + "0", " " + good, "sha256=" + good, good + "\n",
                "g" * 64, "0x" + good[2:], "é" * 32]:
        assert cc.verify(KEY_K, "abc", bad) is False, bad
    assert cc.verify(KEY_K, "abd", good) is False  # another id
    assert cc.verify(KEY_SEQ, "abc", good) is False  # another key


@pytest.mark.parametrize("secret", [b"", b"short", b"x" * 31, b"x" * 33, b"x" * 64])
def test_a_secret_must_be_32_bytes(secret: bytes) -> None:
    message = re.escape(f"callback secret must be exactly 32 bytes (got {len(secret)})")  # awa-pg's text
    with pytest.raises(awa.ValidationError, match=message) as info:
        cc.sign(secret, "abc")
    assert isinstance(info.value, ValueError)  # awa-pg raises ValueError
    with pytest.raises(ValueError, match=message):
        cc.verify(secret, "abc", "00" * 32)


@pytest.mark.parametrize(("args", "what"), [
    (("k" * 32, "abc"), "str secret"),
    ((bytearray(KEY_K), "abc"), "bytearray secret"),
    ((KEY_K, b"abc"), "bytes id"),
    ((KEY_K, None), "None id"),
])
def test_wrong_types_are_type_errors(args: Any, what: str) -> None:
    with pytest.raises(TypeError):
        cc.sign(*args)


def test_an_id_that_is_not_utf8_encodable_is_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        cc.sign(KEY_K, "\ud800")


# (base, prefix, callback_id, action) -> URL, each observed on awa-pg 0.6.9's build_callback_url.
URLS = [
    (("https://x.io", "/api/callbacks", "abc", "complete"), "https://x.io/api/callbacks/abc/complete"),
    (("https://x.io/", "/api/callbacks", "abc", "fail"), "https://x.io/api/callbacks/abc/fail"),
    (("https://x.io//", "/api/callbacks", "abc", "heartbeat"), "https://x.io/api/callbacks/abc/heartbeat"),
    (("https://x.io/sub/", "api/callbacks/", "abc", "complete"), "https://x.io/sub/api/callbacks/abc/complete"),
    (("https://x.io", "", "abc", "complete"), "https://x.io/abc/complete"),
    (("https://x.io", "/", "abc", "complete"), "https://x.io/abc/complete"),
    (("https://x.io", "//", "i", "a"), "https://x.io/i/a"),
    (("https://x.io", "//a//", "abc", "complete"), "https://x.io//a/abc/complete"),
    (("https://x.io", "///a", "i", "a"), "https://x.io///a/i/a"),
    (("", "/api/callbacks", "abc", "complete"), "/api/callbacks/abc/complete"),
    (("///", "p", "i", "a"), "/p/i/a"),
    (("https://x.io", "p", "/i/", "/a"), "https://x.io/p//i///a"),
    (("https://x.io", "/api/callbacks", "", "complete"), "https://x.io/api/callbacks//complete"),
    (("https://x.io", "/api/callbacks", "abc", "resolve"), "https://x.io/api/callbacks/abc/resolve"),
    (("https://x.io?q=1", "p", "i", "a"), "https://x.io?q=1/p/i/a"),
]


@pytest.mark.parametrize(("args", "expected"), URLS)
def test_build_callback_url(args: tuple[str, str, str, str], expected: str) -> None:
    assert cc.build_callback_url(*args) == expected


def test_build_callback_url_refuses_non_strings() -> None:
    for args in [(None, "p", "i", "a"), (b"x", "p", "i", "a"), ("x", "p", 1, "a")]:
        with pytest.raises(TypeError):
            cc.build_callback_url(*args)  # type: ignore[arg-type]


def test_callbacks_serve_accepts_an_awa_pg_signature(database_url: str) -> None:
    from test_serve import JSON, start

    for api in start(ServeConfig(database_url, port=0, callbacks_only=True, callback_secret=KEY_K)):
        path = f"/api/callbacks/{UUID_ID}/complete"
        signed = {**JSON, cc.SIGNATURE_HEADER: AWA_PG_VECTORS[2][2]}  # awa-pg's signature of UUID_ID
        assert api.status("POST", path, {}, headers=signed)[0] == 404  # accepted; no such callback
        upper = {**JSON, cc.SIGNATURE_HEADER: AWA_PG_VECTORS[2][2].upper()}
        assert api.status("POST", path, {}, headers=upper)[0] == 404
        other = {**JSON, cc.SIGNATURE_HEADER: AWA_PG_VECTORS[0][2]}  # awa-pg's signature of "abc"
        assert api.status("POST", path, {}, headers=other)[0] == 401
        unsigned_url = cc.build_callback_url("", cc.DEFAULT_PATH_PREFIX, str(uuid.uuid4()), "fail")
        assert api.status("POST", unsigned_url, {})[0] == 401
