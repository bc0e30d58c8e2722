"""Hiding a URI's secrets (DH-HMAC-CHAP keys) wherever it is shown: in
messages, reprs, logs and benchmark reports.  Kept apart from fabric_uri so
that code that only prints URIs (the bench's reports) needs no C core."""

from __future__ import annotations

from urllib.parse import unquote

# passed to C apart from the target string (fabric_uri), shown as *** here
SECRET_OPTIONS = ("dhchap_secret", "dhchap_ctrl_secret")
REDACTED = "***"


def redact(uri: str) -> str:
    """uri with the values of its secret options replaced by ***: what every
    message, repr and log shows of a URI."""
    if not isinstance(uri, str) or "?" not in uri:
        return uri
    head, _, query = uri.partition("?")
    query, hash_, frag = query.partition("#")
    pairs = []
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        # a misspelt key must not leak its secret either
        if unquote(key.replace("+", " ")) in SECRET_OPTIONS or \
                "DHHC-" in unquote(value).upper():
            pair = f"{key}{eq or '='}{REDACTED}"
        pairs.append(pair)
    return f"{head}?{'&'.join(pairs)}{hash_}{redact(frag) if frag else ''}"
