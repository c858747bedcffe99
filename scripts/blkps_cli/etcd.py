"""etcd's v3 JSON gateway (etcd 3.4: POST /v3/...), from the standard
library: the few calls a lease keeper needs (lease.py). Keys and values
are text here, base64 on the wire; lease ids are etcd's int64s, kept as
the decimal strings the gateway writes.

Several endpoints ("http://127.0.0.1:2379"): each call goes to the one
that answered last, and on to the next while one does not answer (or
answers that it cannot serve now: HTTP 5xx, e.g. while the members elect
a leader); a call no endpoint answers raises Unreachable. Other answers are never retried.
A call retried after a 5xx may have happened on the first member too:
the callers here are safe with that (an extra lease lapses unused; a
create that finds its own key revokes its lease and tries again).
"""

import base64
import json
import urllib.error
import urllib.request


class Error(OSError):
    """etcd answered a call with an error."""


class Unreachable(Error):
    """No endpoint answered the call (etcd down or cut off from here)."""


class Etcd:
    def __init__(self, endpoints, timeout_s):
        """`endpoints`: a list of base URLs; `timeout_s`: how long one
        endpoint may take to answer one call."""
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._first = 0

    def call(self, path, body):
        """POSTs `body` (a dict, as JSON) to `path` ("/v3/kv/range") on the
        endpoints in turn; returns the first answer, parsed. Error if etcd
        refused it, Unreachable if no endpoint answered."""
        data = json.dumps(body).encode()
        reasons = []
        for k in range(len(self.endpoints)):
            at = (self._first + k) % len(self.endpoints)
            request = urllib.request.Request(self.endpoints[at] + path, data=data,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    text = answer.read()
            except urllib.error.HTTPError as e:
                reason = f"etcd {self.endpoints[at]}{path}: HTTP {e.code}: {e.read()[:200]!r}"
                if e.code >= 500:  # this member cannot serve it now (no leader yet): ask another
                    reasons.append(reason)
                    continue
                self._first = at
                raise Error(reason) from None
            except (OSError, ValueError) as e:
                reasons.append(f"{self.endpoints[at]}: {getattr(e, 'reason', e)}")
                continue
            self._first = at
            # The keepalive stream answers {"result": {...}}; the others the object itself.
            answer = json.loads(text.splitlines()[0] if text else b"{}")
            return answer.get("result", answer)
        raise Unreachable("no etcd endpoint answered: " + "; ".join(reasons))

    def grant(self, ttl_s):
        """A new lease of `ttl_s` seconds; its id."""
        return self.call("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"]

    def create(self, key, value, lease, absent=(), also=None):
        """Puts `key` = `value` on `lease` only if neither `key` nor any key
        of `absent` exists (their create revisions are 0), in one
        transaction, with `also` ((key, value), on no lease) put in the same
        transaction; whether it did."""
        k = _b64(key)
        puts = [{"request_put": {"key": k, "value": _b64(value), "lease": lease}}]
        if also is not None:
            puts.append({"request_put": {"key": _b64(also[0]), "value": _b64(also[1])}})
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(c), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                        for c in (key, *absent)],
            "success": puts,
        })
        return bool(answer.get("succeeded"))

    def put_if(self, key, value, guard, guard_value):
        """Puts `key` = `value` (on no lease: it outlives its writer) only
        if key `guard` holds `guard_value`; whether it did."""
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(guard), "target": "VALUE", "result": "EQUAL", "value": _b64(guard_value)}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
        })
        return bool(answer.get("succeeded"))

    def delete_if(self, key, guard, guard_value):
        """Deletes `key` only if key `guard` holds `guard_value`; whether
        the guard held."""
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(guard), "target": "VALUE", "result": "EQUAL", "value": _b64(guard_value)}],
            "success": [{"request_delete_range": {"key": _b64(key)}}],
        })
        return bool(answer.get("succeeded"))

    def delete(self, key):
        """Deletes `key` if it exists."""
        self.call("/v3/kv/deleterange", {"key": _b64(key)})

    def get(self, key):
        """`key`'s value, or None if it does not exist."""
        return self.get_revisions(key)[0]

    def get_revisions(self, key):
        """(`key`'s value or None, the revision it was last written at or
        0, etcd's revision now): a write to any key moves etcd's revision on."""
        answer = self.call("/v3/kv/range", {"key": _b64(key)})
        kvs, now = answer.get("kvs") or [], int(answer.get("header", {}).get("revision", 0))
        if not kvs:
            return None, 0, now
        return base64.b64decode(kvs[0].get("value", "")).decode(), int(kvs[0].get("mod_revision", 0)), now

    def keepalive(self, lease):
        """Renews `lease`; its TTL from now in seconds, 0 if it has lapsed."""
        return int(self.call("/v3/lease/keepalive", {"ID": lease}).get("TTL", 0))

    def revoke(self, lease):
        """Ends `lease` now (its keys go with it)."""
        self.call("/v3/lease/revoke", {"ID": lease})


def _b64(text):
    return base64.b64encode(text.encode()).decode()
