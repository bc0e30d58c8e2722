"""URLs with their secrets masked, for messages, logs and reprs.

A Redis URL may carry a password (``redis://:pw@host:6379/0``,
``redis://user:pw@host``, ``?password=pw``); so may other URLs.  Nothing
here imports the core or a client library: any module may use it.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# query keys whose values are secrets (Redis clients' and NVMe DH-HMAC-CHAP's)
SECRET_QUERY_KEYS = frozenset({"password", "dhchap_secret", "dhchap_ctrl_secret"})


def redact_url(url: object) -> str:
    """url as text with a password in its user part and secret query values
    replaced by ``***``; anything that does not parse as a URL with a
    secret comes back unchanged (as text)."""
    text = str(url)
    if "://" not in text:
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        # unparseable: keep only what cannot be a secret
        return text.split("://", 1)[0] + "://" + MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _pw = userinfo.partition(":")
        # redis://secret@host: Redis clients take a lone user part as the password
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SECRET_QUERY_KEYS for k, _v in pairs):
            query = urlencode([(k, MASK if k.lower() in SECRET_QUERY_KEYS else v)
                               for k, v in pairs], safe=":@*/")
    if netloc == parts.netloc and query == parts.query:
        return text
    out = urlunsplit(parts._replace(netloc=netloc, query=query))
    if not netloc:  # scheme:///path keeps its empty authority
        out = f"{parts.scheme}://" + out[len(parts.scheme) + 1:]
    return out
