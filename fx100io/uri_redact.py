"""Hiding a URI's secrets (DH-HMAC-CHAP secrets, TLS keys) wherever it is shown: in
messages, reprs, logs and benchmark reports.  Kept apart from fabric_uri so
that code that only prints URIs (the bench's reports) needs no C core.

redact() is for NVMe-oF URIs (secrets in the query); redact_url() for any URL
that may carry a password in its user part too (a Redis index URL:
redis://:pw@host:6379/0, redis://user:pw@host, ?password=pw)."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from fx100io import fabric_options

# the option table's secrets: passed to C apart from the target string
# (fabric_uri), shown as *** here
SECRET_OPTIONS = fabric_options.SECRET_OPTIONS
REDACTED = "***"


def _secret(text: str) -> bool:
    """Whether a piece of a URI names or holds a secret, however encoded."""
    plain = unquote(unquote(text.replace("+", " "))).lower()
    return "dhhc-" in plain or "nvmetlskey-" in plain or any(k in plain for k in SECRET_OPTIONS)


def _redact_pairs(part: str) -> str:
    pairs = []
    for pair in part.split("&"):
        key, eq, value = pair.partition("=")
        if not eq and _secret(key):
            # a pair percent-encoded as a whole (dhchap_secret%3DDHHC-1:...)
            pair = REDACTED
        elif _secret(key) or _secret(value):
            # a misspelt key must not leak its secret either
            pair = f"{key}={REDACTED}"
        pairs.append(pair)
    return "&".join(pairs)


def redact(uri: str) -> str:
    """uri with the values of its secret options replaced by ***: what every
    message, repr and log shows of a URI.  Secrets are looked for in the
    query, the fragment and the user part, percent-encoded or not."""
    if not isinstance(uri, str):
        return uri
    rest, hash_, frag = uri.partition("#")
    head, q, query = rest.partition("?")
    if "://" in head:
        scheme, _, after = head.partition("://")
        auth, slash, path = after.partition("/")
        if "@" in auth:
            userinfo, _, hostport = auth.rpartition("@")
            if _secret(userinfo) or ":" in userinfo:
                auth = f"{REDACTED}@{hostport}"
        head = f"{scheme}://{auth}{slash}{path}"
    out = head + (q + _redact_pairs(query) if q else "")
    return out + (hash_ + _redact_pairs(frag) if hash_ else "")


MASK = REDACTED
# query keys whose values are secrets (Redis clients' and NVMe DH-HMAC-CHAP's)
SECRET_QUERY_KEYS = frozenset({"password", "sentinel_password", *SECRET_OPTIONS})


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
        def hidden(k: str, v: str) -> bool:
            # a misspelt key must not leak its DH-HMAC-CHAP secret or TLS key either
            return k.lower() in SECRET_QUERY_KEYS or _secret(k) or _secret(v)

        if any(hidden(k, v) for k, v in pairs):
            # a pair percent-encoded as a whole decodes to a key that holds the value
            query = urlencode([(MASK if _secret(k) and k.lower() not in SECRET_QUERY_KEYS else k,
                                MASK if hidden(k, v) else v) for k, v in pairs], safe=":@*/")
    if netloc == parts.netloc and query == parts.query:
        return text
    out = urlunsplit(parts._replace(netloc=netloc, query=query))
    if not netloc:  # scheme:///path keeps its empty authority
        out = f"{parts.scheme}://" + out[len(parts.scheme) + 1:]
    return out
