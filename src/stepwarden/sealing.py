"""What a dump of the store does not give away: the digest that a re-submit is compared by.

A re-submit under a task's id is the same submission when its workflow, its client and its
input are the same. The input is compared by a digest of its canonical JSON text (keys
sorted, secrets as `{"$secret": VALUE}`), taken when the task is submitted, never by reading
the stored input back and revealing its secrets: an answer that said whether a guessed value
matched a stored secret would let a client guess it.
"""

from __future__ import annotations

import hashlib
import hmac

import orjson

DIGEST_PLAIN = "p"
"""The digest's kind without a key: SHA-256 (the input's secrets are stored plain then)."""
DIGEST_KEYED = "k"
"""The digest's kind with the keyring's digest key: HMAC-SHA256."""


def canonical(text: str | bytes) -> bytes:
    """JSON text with its objects' keys sorted, without spaces: equal for equal values,
    however each store orders an object's keys."""
    return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS)


def input_digest(text: str | bytes, key: bytes | None = None) -> str:
    """The digest of a task's input (its JSON text, secrets as `{"$secret": VALUE}`): its
    kind and the hex digest, `KIND:HEX`; keyed (HMAC-SHA256) when `key` is given."""
    data = canonical(text)
    if key is None:
        return f"{DIGEST_PLAIN}:{hashlib.sha256(data).hexdigest()}"
    return f"{DIGEST_KEYED}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"


def same_digest(stored: str | None, text: str | bytes, key: bytes | None = None) -> bool:
    """Whether `text` has the `stored` digest, in constant time. A keyed digest needs the
    key (without it, False: a comparison that cannot be made is not a match)."""
    if stored is None:
        return False
    kind, _, _ = stored.partition(":")
    if kind == DIGEST_PLAIN:
        mine = input_digest(text)
    elif kind == DIGEST_KEYED and key is not None:
        mine = input_digest(text, key)
    else:
        return False
    return hmac.compare_digest(mine.encode(), stored.encode())
