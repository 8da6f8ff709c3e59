import minikv.protocol as protocol
import minikv.session as session_mod
import minikv.store as store
import pytest


@pytest.fixture
def session():
    return session_mod.Session(store.Store(clock=lambda: 0.0))


def ex(session, line):
    return session.execute(line.split(" "))


def test_errors_are_returned_not_raised(session):
    reply = ex(session, "GET")
    assert isinstance(reply, protocol.CommandError)
    assert str(reply) == "ERR wrong number of arguments for 'get' command"


def test_multi_exec_runs_in_order(session):
    assert ex(session, "MULTI") == protocol.Status("OK")
    assert ex(session, "SET a 1") == protocol.Status("QUEUED")
    assert ex(session, "INCR a") == protocol.Status("QUEUED")
    assert ex(session, "GET a") == protocol.Status("QUEUED")
    assert ex(session, "EXEC") == [protocol.Status("OK"), 2, "2"]
    assert ex(session, "GET a") == "2"


def test_runtime_error_inside_exec_does_not_stop_others(session):
    ex(session, "MULTI")
    ex(session, "SET s abc")
    ex(session, "INCR s")
    ex(session, "SET t 1")
    result = ex(session, "EXEC")
    assert result[0] == protocol.Status("OK") and result[2] == protocol.Status("OK")
    assert isinstance(result[1], protocol.CommandError)
    assert str(result[1]) == "ERR value is not an integer or out of range"


def test_queue_time_error_aborts_exec(session):
    ex(session, "MULTI")
    ex(session, "SET a 1")
    bad = ex(session, "NOPE x")
    assert str(bad) == "ERR unknown command 'NOPE'"
    arity = ex(session, "GET")
    assert isinstance(arity, protocol.CommandError)
    result = ex(session, "EXEC")
    assert isinstance(result, protocol.CommandError)
    assert str(result) == "EXECABORT Transaction discarded because of previous errors."
    assert ex(session, "GET a") is None
    assert str(ex(session, "EXEC")) == "ERR EXEC without MULTI"


def test_discard_and_without_multi(session):
    assert str(ex(session, "DISCARD")) == "ERR DISCARD without MULTI"
    ex(session, "MULTI")
    ex(session, "SET a 1")
    assert ex(session, "DISCARD") == protocol.Status("OK")
    assert ex(session, "GET a") is None


def test_nested_multi_keeps_transaction(session):
    ex(session, "MULTI")
    assert str(ex(session, "MULTI")) == "ERR MULTI calls can not be nested"
    ex(session, "SET a 1")
    assert ex(session, "EXEC") == [protocol.Status("OK")]


def test_exec_with_empty_queue(session):
    ex(session, "MULTI")
    assert ex(session, "EXEC") == []


def test_save_without_path(session):
    assert str(ex(session, "SAVE")) == "ERR no snapshot path configured"


def test_run_line(session):
    assert session.run_line("") is None
    assert session.run_line("   # comment") is None
    assert session.run_line('SET k "two words"') == "OK"
    assert session.run_line("GET k") == '"two words"'
    assert session.run_line('GET "k') == "(error) ERR unbalanced quotes"
    assert session.run_line("RPUSH l a b") == "(integer) 2"
    assert session.run_line("LRANGE l 0 -1") == '1) "a"\n2) "b"'
    assert session.run_line("GET missing") == "(nil)"


def test_run_line_exec_nested_rendering(session):
    session.run_line("RPUSH l x y")
    session.run_line("MULTI")
    assert session.run_line("LRANGE l 0 -1") == "QUEUED"
    session.run_line("GET l")
    assert session.run_line("EXEC") == (
        '1) 1) "x"\n   2) "y"\n'
        "2) (error) WRONGTYPE Operation against a key holding the wrong kind of value"
    )
