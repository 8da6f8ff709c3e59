"""The persistent shell: commands that try to wedge it, env and cwd, many threads at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.timeout(90)


def _still_works(sandbox) -> None:
    result = sandbox.exec("echo alive")
    assert result.stdout == "alive\n" and result.exit_code == 0, result


def test_exit_ends_only_the_command(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("echo before; exit 3; echo after")
    assert (result.exit_code, result.stdout, result.shell_restarted) == (3, "before\n", False)
    _still_works(sandbox)


def test_killing_the_shell_restarts_it_and_the_next_command_runs(make, any_backend):
    sandbox = make(any_backend)
    for attempt in range(3):  # the shell's death races with the next command: try a few
        first = sandbox.exec("kill -9 $$", timeout=20)
        second = sandbox.exec(f"echo alive-{attempt} | tee -a runs.txt", timeout=20)
        assert (second.stdout, second.exit_code) == (f"alive-{attempt}\n", 0), (first, second)
        assert first.shell_restarted or second.shell_restarted, (first, second)
        flagged = first if first.shell_restarted else second
        assert "started" in flagged.stderr, flagged
    # A command is never run twice, even when it is retried on a fresh shell.
    assert sandbox.read_file("runs.txt") == b"alive-0\nalive-1\nalive-2\n"


def test_exec_replaces_only_the_command(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("exec echo replaced")
    assert (result.exit_code, result.stdout) == (0, "replaced\n")
    assert sandbox.exec("exec false").exit_code == 1
    _still_works(sandbox)


def test_closed_stdin_stdout_and_stderr_do_not_wedge_the_shell(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("exec 0<&-; cat; read -r line; echo read=$?", timeout=10)
    assert not result.timed_out and "read=1" in result.stdout, result
    result = sandbox.exec("exec 1>&- 2>&-; echo lost; echo lost >&2", timeout=10)
    assert not result.timed_out and result.stdout == "" and result.stderr == "", result
    _still_works(sandbox)


def test_reading_stdin_does_not_eat_the_control_stream(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("cat; head -c 100 /dev/stdin | wc -c", timeout=10)
    assert (result.exit_code, result.stdout.strip(), result.timed_out) == (0, "0", False)
    _still_works(sandbox)


def test_binary_output_and_fake_markers_do_not_confuse_the_shell(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("head -c 200000 /dev/urandom; printf '\\036GYRE0123456789abcdef:0\\n'")
    assert result.exit_code == 0 and not result.shell_restarted
    assert result.stdout.endswith("\x1eGYRE0123456789abcdef:0\n")
    assert 150_000 < len(result.stdout) < 400_000  # invalid runs decode to one U+FFFD
    result = sandbox.exec("printf 'no newline'; printf 'err no newline' >&2")
    assert (result.stdout, result.stderr) == ("no newline", "err no newline")
    _still_works(sandbox)


def test_a_background_process_holding_stdout_does_not_block_the_command(make, any_backend):
    sandbox = make(any_backend)
    start = time.monotonic()
    result = sandbox.exec("(sleep 30 &); echo done", timeout=20)
    assert (result.stdout, result.timed_out) == ("done\n", False)
    assert time.monotonic() - start < 10
    _still_works(sandbox)


def test_env_and_cwd(make, any_backend):
    sandbox = make(any_backend, env={"GYRE_TEST_CONFIG": "from-config"})
    assert sandbox.exec("pwd").stdout.strip() == sandbox.workspace
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    tricky = "a b 'c' \"d\" $HOME `x` \\ ;"
    result = sandbox.exec('printf %s "$V"; echo; echo $GYRE_TEST_CONFIG', env={"V": tricky})
    assert result.stdout == f"{tricky}\nfrom-config\n"
    over = sandbox.exec("echo $GYRE_TEST_CONFIG", env={"GYRE_TEST_CONFIG": "per-call"})
    assert over.stdout == "per-call\n"
    # Nothing leaks from one command to the next: not cd, not export.
    sandbox.exec("cd /tmp; export LEAK=1")
    assert sandbox.exec("pwd; echo ${LEAK:-none}").stdout == f"{sandbox.workspace}\nnone\n"
    missing = sandbox.exec("echo unreachable", cwd="/no/such/dir")
    assert missing.exit_code != 0 and missing.stdout == ""
    with pytest.raises(ValueError, match="invalid environment variable name"):
        sandbox.exec("true", env={"BAD NAME": "x"})


def test_many_threads_on_one_sandbox_get_their_own_output(make, any_backend):
    sandbox = make(any_backend)

    def worker(n: int) -> list[tuple[str, str]]:
        got = []
        for i in range(10):
            result = sandbox.exec(f"echo {n}-{i}; echo err-{n}-{i} >&2")
            got.append((result.stdout, result.stderr))
        return got

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    for n, got in enumerate(results):
        assert got == [(f"{n}-{i}\n", f"err-{n}-{i}\n") for i in range(10)]


@pytest.mark.slow
def test_eight_sandboxes_at_once(make, isolated_backend):
    def episode(n: int) -> list[str]:
        sandbox = make(isolated_backend)
        sandbox.write_file("n.txt", str(n))
        out = [sandbox.exec(f"cat n.txt; echo -{i}").stdout for i in range(5)]
        out.append(sandbox.read_file("n.txt").decode())
        return out

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(episode, range(8)))
    for n, out in enumerate(results):
        assert out == [f"{n}-{i}\n" for i in range(5)] + [str(n)]


def test_the_output_cap_keeps_head_and_tail_and_counts_what_it_drops():
    """The byte cap of a stream keeps its first and last halves; the characters dropped in
    between are counted exactly (multi-byte and invalid UTF-8 included, split anywhere)."""
    import random

    from gyre_env.sandbox.shell import _Stream

    marker = b"\x1eGYREtoken:"
    units = [b"x", b"\n", "é".encode(), "€".encode(), "🙂".encode(), b"\xff", b"\x80"]
    for seed in range(200):
        rng = random.Random(seed)
        data = b"".join(rng.choice(units) for _ in range(rng.randint(0, 300)))
        stream, after, sent = _Stream(rng.randint(2, 64)), None, data + marker + b"7\n"
        while sent:  # reads of random sizes: the marker may be split across them
            size = rng.randint(1, 16)
            chunk, sent = sent[:size], sent[size:]
            if after is not None:
                after += chunk
            elif (at := stream.feed(chunk, marker)) is not None:
                after = chunk[at:]
        whole, text = data.decode("utf-8", errors="replace"), stream.text()
        assert after == b"7\n", seed  # the exit code right after the marker, never eaten
        assert len(text) + stream.omitted_chars == len(whole), seed
        if not stream.dropped:
            assert text == whole and stream.omitted_chars == 0
        else:
            assert len(stream.head) + len(stream.tail) == stream.limit
            shared = next(
                (i for i, (a, b) in enumerate(zip(text, whole, strict=False)) if a != b),
                len(text),
            )
            assert whole.endswith(text[shared:]), seed  # a head of whole, then a tail


def test_output_over_the_cap_keeps_both_ends(make):
    sandbox = make("local", output_limit=1000)
    result = sandbox.exec("printf 'start\\n'; yes é | head -n 5000; echo end; echo err >&2")
    assert result.truncated and result.exit_code == 0
    assert result.stdout.startswith("start\né\n") and result.stdout.endswith("é\nend\n")
    assert len(result.stdout) + result.stdout_omitted == len("start\n") + 5000 * 2 + 4
    assert (result.stderr, result.stderr_omitted) == ("err\n", 0)
