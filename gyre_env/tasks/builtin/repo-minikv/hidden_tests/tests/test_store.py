import minikv.protocol as protocol
import minikv.store as store_mod
import pytest

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOT_INT = "ERR value is not an integer or out of range"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Err:
    def __init__(self, message):
        self.message = message


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    return store_mod.Store(clock=clock)


def play(store, steps):
    for line, expected in steps:
        args = line.split(" ")
        if isinstance(expected, Err):
            with pytest.raises(protocol.CommandError) as info:
                store.execute(*args)
            assert str(info.value) == expected.message, line
        else:
            got = store.execute(*args)
            assert got == expected, line
            assert type(got) is type(expected) or isinstance(expected, list), line


SCENARIOS = {
    "ping_echo": [("PING", protocol.Status("PONG")), ("ping hi", "hi"), ("ECHO x", "x")],
    "set_get_case_insensitive": [
        ("set k v", protocol.Status("OK")),
        ("GeT k", "v"),
        ("GET nope", None),
    ],
    "unknown_command": [("FROB k", Err("ERR unknown command 'FROB'"))],
    "arity": [
        ("GET", Err("ERR wrong number of arguments for 'get' command")),
        ("GET a b", Err("ERR wrong number of arguments for 'get' command")),
        ("DEL", Err("ERR wrong number of arguments for 'del' command")),
    ],
    "del_exists": [
        ("SET a 1", protocol.Status("OK")),
        ("SET b 2", protocol.Status("OK")),
        ("EXISTS a a b c", 3),
        ("DEL a c", 1),
        ("EXISTS a", 0),
        ("DBSIZE", 1),
    ],
    "set_nx_xx": [
        ("SET k 1 NX", protocol.Status("OK")),
        ("SET k 2 NX", None),
        ("GET k", "1"),
        ("SET k 3 xx", protocol.Status("OK")),
        ("SET other 1 XX", None),
        ("GET k", "3"),
    ],
    "set_syntax": [
        ("SET k v EX", Err("ERR syntax error")),
        ("SET k v NX XX", Err("ERR syntax error")),
        ("SET k v EX 1 PX 5", Err("ERR syntax error")),
        ("SET k v KEEP", Err("ERR syntax error")),
        ("SET k v EX x", Err(NOT_INT)),
        ("SET k v EX 0", Err("ERR invalid expire time in 'set' command")),
    ],
    "set_replaces_other_type": [
        ("RPUSH k a", 1),
        ("SET k v", protocol.Status("OK")),
        ("TYPE k", protocol.Status("string")),
    ],
    "mget": [
        ("SET a 1", protocol.Status("OK")),
        ("RPUSH l x", 1),
        ("MGET a l missing", ["1", None, None]),
    ],
    "append_strlen": [
        ("APPEND k ab", 2),
        ("APPEND k cd", 4),
        ("GET k", "abcd"),
        ("STRLEN k", 4),
        ("STRLEN none", 0),
    ],
    "counters": [
        ("INCR c", 1),
        ("INCRBY c 10", 11),
        ("DECR c", 10),
        ("DECRBY c -5", 15),
        ("GET c", "15"),
    ],
    "counter_not_int": [
        ("SET s abc", protocol.Status("OK")),
        ("INCR s", Err(NOT_INT)),
        ("SET f 1.5", protocol.Status("OK")),
        ("INCR f", Err(NOT_INT)),
        ("INCRBY x +1", Err(NOT_INT)),
        ("INCRBY x 9223372036854775808", Err(NOT_INT)),
    ],
    "counter_overflow": [
        ("SET m 9223372036854775807", protocol.Status("OK")),
        ("INCR m", Err("ERR increment or decrement would overflow")),
        ("GET m", "9223372036854775807"),
        ("DECRBY n 9223372036854775807", -9223372036854775807),
        ("DECRBY n 2", Err("ERR increment or decrement would overflow")),
    ],
    "type": [
        ("SET s v", protocol.Status("OK")),
        ("LPUSH l v", 1),
        ("HSET h f v", 1),
        ("SADD z m", 1),
        ("TYPE s", protocol.Status("string")),
        ("TYPE l", protocol.Status("list")),
        ("TYPE h", protocol.Status("hash")),
        ("TYPE z", protocol.Status("set")),
        ("TYPE nope", protocol.Status("none")),
    ],
    "wrongtype": [
        ("LPUSH l a", 1),
        ("GET l", Err(WRONGTYPE)),
        ("HGET l f", Err(WRONGTYPE)),
        ("SADD l m", Err(WRONGTYPE)),
        ("INCR l", Err(WRONGTYPE)),
        ("APPEND l x", Err(WRONGTYPE)),
        ("SET s v", protocol.Status("OK")),
        ("LLEN s", Err(WRONGTYPE)),
    ],
    "keys_sorted": [
        ("SET user:2 a", protocol.Status("OK")),
        ("SET user:1 b", protocol.Status("OK")),
        ("SET other c", protocol.Status("OK")),
        ("KEYS user:*", ["user:1", "user:2"]),
        ("KEYS *", ["other", "user:1", "user:2"]),
        ("KEYS nomatch*", []),
    ],
    "rename": [
        ("SET a 1", protocol.Status("OK")),
        ("SET b 2", protocol.Status("OK")),
        ("RENAME a b", protocol.Status("OK")),
        ("GET b", "1"),
        ("EXISTS a", 0),
        ("RENAME a c", Err("ERR no such key")),
    ],
    "flushall": [
        ("SET a 1", protocol.Status("OK")),
        ("SADD s x", 1),
        ("FLUSHALL", protocol.Status("OK")),
        ("DBSIZE", 0),
    ],
    "lpush_rpush_order": [
        ("LPUSH l a b", 2),
        ("RPUSH l c d", 4),
        ("LRANGE l 0 -1", ["b", "a", "c", "d"]),
    ],
    "lpop_rpop_and_empty_deletes": [
        ("RPUSH l a b", 2),
        ("LPOP l", "a"),
        ("RPOP l", "b"),
        ("EXISTS l", 0),
        ("LPOP l", None),
        ("RPOP none", None),
    ],
    "llen_lindex": [
        ("RPUSH l a b c", 3),
        ("LLEN l", 3),
        ("LINDEX l 0", "a"),
        ("LINDEX l -1", "c"),
        ("LINDEX l 3", None),
        ("LINDEX l -4", None),
        ("LLEN none", 0),
        ("LINDEX l x", Err(NOT_INT)),
    ],
    "lrange_indices": [
        ("RPUSH l a b c d e", 5),
        ("LRANGE l 1 3", ["b", "c", "d"]),
        ("LRANGE l -2 -1", ["d", "e"]),
        ("LRANGE l -100 1", ["a", "b"]),
        ("LRANGE l 3 100", ["d", "e"]),
        ("LRANGE l 4 2", []),
        ("LRANGE l 5 10", []),
        ("LRANGE none 0 -1", []),
    ],
    "hashes": [
        ("HSET h a 1 b 2", 2),
        ("HSET h a 9 c 3", 1),
        ("HGET h a", "9"),
        ("HGET h zz", None),
        ("HLEN h", 3),
        ("HEXISTS h b", 1),
        ("HEXISTS h q", 0),
        ("HGETALL h", ["a", "9", "b", "2", "c", "3"]),
    ],
    "hset_arity": [
        ("HSET h a", Err("ERR wrong number of arguments for 'hset' command")),
        ("HSET h a 1 b", Err("ERR wrong number of arguments for 'hset' command")),
    ],
    "hdel_deletes_empty": [
        ("HSET h a 1 b 2", 2),
        ("HDEL h a a zz", 1),
        ("HDEL h b", 1),
        ("EXISTS h", 0),
        ("HGETALL h", []),
        ("HDEL h x", 0),
    ],
    "hincrby": [
        ("HINCRBY h n 5", 5),
        ("HINCRBY h n -7", -2),
        ("HGET h n", "-2"),
        ("HSET h s x", 1),
        ("HINCRBY h s 1", Err("ERR hash value is not an integer")),
        ("HINCRBY h n x", Err(NOT_INT)),
    ],
    "sets": [
        ("SADD s b a b", 2),
        ("SADD s c a", 1),
        ("SCARD s", 3),
        ("SISMEMBER s a", 1),
        ("SISMEMBER s z", 0),
        ("SMEMBERS s", ["a", "b", "c"]),
        ("SREM s a z", 1),
        ("SMEMBERS s", ["b", "c"]),
        ("SCARD none", 0),
        ("SMEMBERS none", []),
    ],
    "srem_deletes_empty": [("SADD s a", 1), ("SREM s a", 1), ("EXISTS s", 0), ("SREM s a", 0)],
    "sinter_sunion": [
        ("SADD x a b c", 3),
        ("SADD y b c d", 3),
        ("SINTER x y", ["b", "c"]),
        ("SUNION x y", ["a", "b", "c", "d"]),
        ("SINTER x missing", []),
        ("SUNION missing", []),
        ("SET str v", protocol.Status("OK")),
        ("SINTER x str", Err(WRONGTYPE)),
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario(store, name):
    play(store, SCENARIOS[name])


def test_expire_and_ttl(store, clock):
    play(
        store,
        [
            ("SET k v", protocol.Status("OK")),
            ("TTL k", -1),
            ("EXPIRE k 10", 1),
            ("TTL k", 10),
            ("EXPIRE nope 10", 0),
            ("TTL nope", -2),
        ],
    )
    clock.now += 2.5
    play(store, [("TTL k", 8), ("PTTL k", 7500)])
    clock.now += 7.5
    play(store, [("GET k", None), ("TTL k", -2), ("EXISTS k", 0), ("DBSIZE", 0), ("KEYS *", [])])


def test_ttl_rounds_up(store, clock):
    store.execute("SET", "k", "v", "PX", "1500")
    assert store.execute("TTL", "k") == 2
    clock.now += 1.2
    assert store.execute("TTL", "k") == 1
    assert store.execute("PTTL", "k") == 300


def test_set_ex_px_and_set_drops_ttl(store, clock):
    play(
        store,
        [
            ("SET k v EX 5", protocol.Status("OK")),
            ("TTL k", 5),
            ("SET k w", protocol.Status("OK")),
            ("TTL k", -1),
            ("SET p v px 250", protocol.Status("OK")),
            ("PTTL p", 250),
        ],
    )
    clock.now += 0.25
    assert store.execute("GET", "p") is None


def test_in_place_changes_keep_ttl(store, clock):
    play(
        store,
        [
            ("RPUSH l a", 1),
            ("EXPIRE l 10", 1),
            ("RPUSH l b", 2),
            ("TTL l", 10),
            ("SET c 1", protocol.Status("OK")),
            ("EXPIRE c 10", 1),
            ("INCR c", 2),
            ("TTL c", 10),
        ],
    )


def test_persist_and_nonpositive_expire(store):
    play(
        store,
        [
            ("SET k v", protocol.Status("OK")),
            ("PERSIST k", 0),
            ("EXPIRE k 100", 1),
            ("PERSIST k", 1),
            ("TTL k", -1),
            ("EXPIRE k 0", 1),
            ("EXISTS k", 0),
            ("SET j v", protocol.Status("OK")),
            ("PEXPIRE j -5", 1),
            ("EXISTS j", 0),
            ("SET m v", protocol.Status("OK")),
            ("EXPIRE m x", Err(NOT_INT)),
        ],
    )


def test_rename_keeps_ttl(store, clock):
    play(
        store,
        [
            ("SET a v", protocol.Status("OK")),
            ("EXPIRE a 30", 1),
            ("RENAME a b", protocol.Status("OK")),
            ("TTL b", 30),
        ],
    )


def test_expired_key_can_be_recreated_with_other_type(store, clock):
    play(store, [("SET k v EX 1", protocol.Status("OK"))])
    clock.now += 1
    play(store, [("LPUSH k a", 1), ("TYPE k", protocol.Status("list")), ("TTL k", -1)])


def test_arity_checked_before_type(store):
    store.execute("SET", "s", "v")
    with pytest.raises(protocol.CommandError, match="wrong number of arguments for 'lpush'"):
        store.execute("LPUSH", "s")
