"""The data and the commands."""

import math
import re
import time

from minikv.globmatch import glob_match
from minikv.protocol import CommandError, Status

OK = Status("OK")
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOT_INT = "ERR value is not an integer or out of range"
_INT_RE = re.compile(r"-?[0-9]+")

# name -> (method, minimum argument count, maximum or None); counts exclude the name
COMMANDS = {}


def command(name, min_args, max_args=None):
    def register(fn):
        COMMANDS[name] = (fn, min_args, max_args)
        return fn

    return register


def parse_int(text, error=NOT_INT):
    if not _INT_RE.fullmatch(text):
        raise CommandError(error)
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise CommandError(error)
    return value


def check_arity(args, extra=None):
    """Raise the unknown-command or arity error for args; returns the lowercase name.

    ``extra`` maps more command names (handled by a session) to (min, max) counts.
    """
    name = args[0].lower()
    extra = extra or {}
    if name in extra:
        lo, hi = extra[name]
    elif name in COMMANDS:
        _, lo, hi = COMMANDS[name]
    else:
        raise CommandError(f"ERR unknown command '{args[0]}'")
    n = len(args) - 1
    if n < lo or (hi is not None and n > hi) or (name == "hset" and n % 2 == 0):
        raise CommandError(f"ERR wrong number of arguments for '{name}' command")
    return name


class Store:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.data = {}  # key -> (type, value)
        self.expires = {}  # key -> absolute clock time

    # ------------------------------------------------------------------ helpers
    def execute(self, *args):
        if not args:
            raise CommandError("ERR empty command")
        name = check_arity(args)
        return COMMANDS[name][0](self, *args[1:])

    def _alive(self, key):
        deadline = self.expires.get(key)
        if deadline is not None and self.clock() >= deadline:
            self.data.pop(key, None)
            del self.expires[key]
        return key in self.data

    def _get(self, key, kind):
        if not self._alive(key):
            return None
        t, value = self.data[key]
        if t != kind:
            raise CommandError(WRONGTYPE)
        return value

    def _get_or_create(self, key, kind, factory):
        value = self._get(key, kind)
        if value is None:
            value = factory()
            self.data[key] = (kind, value)
        return value

    def _cleanup(self, key):
        if key in self.data and not self.data[key][1] and self.data[key][0] != "string":
            del self.data[key]
            self.expires.pop(key, None)

    def _delete(self, key):
        existed = self._alive(key)
        self.data.pop(key, None)
        self.expires.pop(key, None)
        return existed

    def keys(self):
        return sorted(k for k in list(self.data) if self._alive(k))

    def ttl_ms(self, key):
        """Remaining milliseconds (float) or None; key must exist."""
        deadline = self.expires.get(key)
        return None if deadline is None else (deadline - self.clock()) * 1000.0

    # ------------------------------------------------------------- server/keys
    @command("ping", 0, 1)
    def ping(self, *message):
        return message[0] if message else Status("PONG")

    @command("echo", 1, 1)
    def echo(self, message):
        return message

    @command("dbsize", 0, 0)
    def dbsize(self):
        return len(self.keys())

    @command("flushall", 0, 0)
    def flushall(self):
        self.data.clear()
        self.expires.clear()
        return OK

    @command("del", 1)
    def delete(self, *keys):
        return sum(self._delete(k) for k in keys)

    @command("exists", 1)
    def exists(self, *keys):
        return sum(self._alive(k) for k in keys)

    @command("type", 1, 1)
    def type_cmd(self, key):
        return Status(self.data[key][0] if self._alive(key) else "none")

    @command("keys", 1, 1)
    def keys_cmd(self, pattern):
        return [k for k in self.keys() if glob_match(pattern, k)]

    @command("rename", 2, 2)
    def rename(self, key, newkey):
        if not self._alive(key):
            raise CommandError("ERR no such key")
        value, deadline = self.data.pop(key), self.expires.pop(key, None)
        self._delete(newkey)
        self.data[newkey] = value
        if deadline is not None:
            self.expires[newkey] = deadline
        return OK

    def _expire(self, key, seconds):
        if not self._alive(key):
            return 0
        if seconds <= 0:
            self._delete(key)
        else:
            self.expires[key] = self.clock() + seconds
        return 1

    @command("expire", 2, 2)
    def expire(self, key, seconds):
        return self._expire(key, parse_int(seconds))

    @command("pexpire", 2, 2)
    def pexpire(self, key, ms):
        return self._expire(key, parse_int(ms) / 1000.0)

    def _ttl(self, key, scale):
        if not self._alive(key):
            return -2
        ms = self.ttl_ms(key)
        if ms is None:
            return -1
        return math.ceil(ms / scale - 1e-9)

    @command("ttl", 1, 1)
    def ttl(self, key):
        return self._ttl(key, 1000.0)

    @command("pttl", 1, 1)
    def pttl(self, key):
        return self._ttl(key, 1.0)

    @command("persist", 1, 1)
    def persist(self, key):
        if self._alive(key) and key in self.expires:
            del self.expires[key]
            return 1
        return 0

    # ------------------------------------------------------------------ strings
    @command("set", 2)
    def set_cmd(self, key, value, *options):
        expire, cond, i = None, None, 0
        while i < len(options):
            opt = options[i].lower()
            if opt in ("ex", "px"):
                if expire is not None or i + 1 >= len(options):
                    raise CommandError("ERR syntax error")
                amount = parse_int(options[i + 1])
                if amount <= 0:
                    raise CommandError("ERR invalid expire time in 'set' command")
                expire = amount if opt == "ex" else amount / 1000.0
                i += 2
            elif opt in ("nx", "xx"):
                if cond is not None:
                    raise CommandError("ERR syntax error")
                cond = opt
                i += 1
            else:
                raise CommandError("ERR syntax error")
        exists = self._alive(key)
        if (cond == "nx" and exists) or (cond == "xx" and not exists):
            return None
        self._delete(key)
        self.data[key] = ("string", value)
        if expire is not None:
            self.expires[key] = self.clock() + expire
        return OK

    @command("get", 1, 1)
    def get(self, key):
        return self._get(key, "string")

    @command("mget", 1)
    def mget(self, *keys):
        out = []
        for k in keys:
            alive = self._alive(k)
            out.append(self.data[k][1] if alive and self.data[k][0] == "string" else None)
        return out

    @command("append", 2, 2)
    def append(self, key, value):
        new = (self._get(key, "string") or "") + value
        self.data[key] = ("string", new)
        return len(new)

    @command("strlen", 1, 1)
    def strlen(self, key):
        return len(self._get(key, "string") or "")

    def _incr(self, key, delta):
        current = parse_int(self._get(key, "string") or "0")
        new = current + delta
        if not INT_MIN <= new <= INT_MAX:
            raise CommandError("ERR increment or decrement would overflow")
        self.data[key] = ("string", str(new))
        return new

    @command("incr", 1, 1)
    def incr(self, key):
        return self._incr(key, 1)

    @command("decr", 1, 1)
    def decr(self, key):
        return self._incr(key, -1)

    @command("incrby", 2, 2)
    def incrby(self, key, n):
        return self._incr(key, parse_int(n))

    @command("decrby", 2, 2)
    def decrby(self, key, n):
        return self._incr(key, -parse_int(n))

    # -------------------------------------------------------------------- lists
    @command("lpush", 2)
    def lpush(self, key, *values):
        items = self._get_or_create(key, "list", list)
        for v in values:
            items.insert(0, v)
        return len(items)

    @command("rpush", 2)
    def rpush(self, key, *values):
        items = self._get_or_create(key, "list", list)
        items.extend(values)
        return len(items)

    def _pop(self, key, index):
        items = self._get(key, "list")
        if not items:
            return None
        value = items.pop(index)
        self._cleanup(key)
        return value

    @command("lpop", 1, 1)
    def lpop(self, key):
        return self._pop(key, 0)

    @command("rpop", 1, 1)
    def rpop(self, key):
        return self._pop(key, -1)

    @command("llen", 1, 1)
    def llen(self, key):
        return len(self._get(key, "list") or [])

    @command("lindex", 2, 2)
    def lindex(self, key, index):
        i = parse_int(index)
        items = self._get(key, "list") or []
        if i < 0:
            i += len(items)
        return items[i] if 0 <= i < len(items) else None

    @command("lrange", 3, 3)
    def lrange(self, key, start, stop):
        a, b = parse_int(start), parse_int(stop)
        items = self._get(key, "list") or []
        n = len(items)
        if a < 0:
            a += n
        if b < 0:
            b += n
        a = max(a, 0)
        b = min(b, n - 1)
        return items[a : b + 1] if a <= b else []

    # ------------------------------------------------------------------- hashes
    @command("hset", 3)
    def hset(self, key, *pairs):
        h = self._get_or_create(key, "hash", dict)
        new = 0
        for field, value in zip(pairs[::2], pairs[1::2], strict=True):
            new += field not in h
            h[field] = value
        return new

    @command("hget", 2, 2)
    def hget(self, key, field):
        return (self._get(key, "hash") or {}).get(field)

    @command("hdel", 2)
    def hdel(self, key, *fields):
        h = self._get(key, "hash")
        if h is None:
            return 0
        removed = sum(h.pop(f, None) is not None for f in dict.fromkeys(fields))
        self._cleanup(key)
        return removed

    @command("hlen", 1, 1)
    def hlen(self, key):
        return len(self._get(key, "hash") or {})

    @command("hexists", 2, 2)
    def hexists(self, key, field):
        return int(field in (self._get(key, "hash") or {}))

    @command("hgetall", 1, 1)
    def hgetall(self, key):
        h = self._get(key, "hash") or {}
        out = []
        for field in sorted(h):
            out.extend([field, h[field]])
        return out

    @command("hincrby", 3, 3)
    def hincrby(self, key, field, n):
        delta = parse_int(n)
        h = self._get(key, "hash")
        current = parse_int((h or {}).get(field, "0"), "ERR hash value is not an integer")
        new = current + delta
        if not INT_MIN <= new <= INT_MAX:
            raise CommandError("ERR increment or decrement would overflow")
        self._get_or_create(key, "hash", dict)[field] = str(new)
        return new

    # --------------------------------------------------------------------- sets
    @command("sadd", 2)
    def sadd(self, key, *members):
        s = self._get_or_create(key, "set", set)
        before = len(s)
        s.update(members)
        return len(s) - before

    @command("srem", 2)
    def srem(self, key, *members):
        s = self._get(key, "set")
        if s is None:
            return 0
        before = len(s)
        s.difference_update(members)
        removed = before - len(s)
        self._cleanup(key)
        return removed

    @command("scard", 1, 1)
    def scard(self, key):
        return len(self._get(key, "set") or ())

    @command("sismember", 2, 2)
    def sismember(self, key, member):
        return int(member in (self._get(key, "set") or ()))

    @command("smembers", 1, 1)
    def smembers(self, key):
        return sorted(self._get(key, "set") or ())

    @command("sinter", 1)
    def sinter(self, *keys):
        sets = [self._get(k, "set") or set() for k in keys]
        return sorted(set.intersection(*sets))

    @command("sunion", 1)
    def sunion(self, *keys):
        sets = [self._get(k, "set") or set() for k in keys]
        return sorted(set.union(*sets))
