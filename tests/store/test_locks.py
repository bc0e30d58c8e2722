"""fx100io.locks: the one lock mechanism of the store, the adapters and the kernel path."""

from __future__ import annotations

import multiprocessing
import os
import time

from fx100io import locks


def _hold_in_child(path: str, shared: bool, ready, done) -> None:
    held = locks.lock(path, shared=shared)
    ready.put(held is not None)
    done.get(timeout=60)


def _child(path: str):
    """A process that tried to lock path and waits; (it, whether it got the lock, done)."""
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_hold_in_child, args=(path, False, ready, done))
    p.start()
    return p, ready.get(timeout=60), done


def _another_process_can_lock(path) -> bool:
    p, got, done = _child(str(path))
    done.put(1)
    p.join(60)
    return got


def _held_until_both_go(path, a, b) -> None:
    """a and b hold path together: it stays locked until both are released."""
    assert a is not None and b is not None
    assert locks.lock(path) is None
    a.release()
    assert locks.lock(path) is None
    b.release()
    free = locks.lock(path)
    assert free is not None
    free.release()


def test_exclusive_refuses_a_second_holder_even_in_this_process(tmp_path):
    path = tmp_path / "f.lock"
    first = locks.lock(path, create=True)
    assert first is not None and first.held
    assert locks.lock(path) is None  # another open file description: refused
    first.release()
    first.release()  # twice is harmless
    assert not first.held
    with locks.lock(path) as again:
        assert again is not None


def test_shared_locks_share_and_keep_an_exclusive_out(tmp_path):
    path = tmp_path / "f.lock"
    _held_until_both_go(path, locks.lock(path, shared=True, create=True),
                        locks.lock(path, shared=True))


def test_timeout_waits_then_gives_up(tmp_path):
    path = tmp_path / "f.lock"
    with locks.lock(path, create=True):
        t0 = time.monotonic()
        assert locks.lock(path, timeout=0.2) is None
        assert time.monotonic() - t0 >= 0.2


def test_a_dead_process_holds_nothing(tmp_path):
    path = str(tmp_path / "f.lock")
    open(path, "w").close()
    p, got, done = _child(path)
    assert got
    assert locks.lock(path) is None
    p.kill()
    p.join(60)
    held = locks.lock(path, timeout=10)
    assert held is not None
    held.release()
    assert _another_process_can_lock(path)


def test_closing_another_descriptor_keeps_the_lock(tmp_path):
    # the trap of POSIX locks (lockf) that flock does not have
    path = str(tmp_path / "f.lock")
    held = locks.lock(path, create=True)
    os.close(os.open(path, os.O_RDONLY))
    assert not _another_process_can_lock(path)
    held.release()


def test_a_claim_lets_one_lock_of_this_process_in(tmp_path):
    path = tmp_path / "dev.img"
    claim = locks.claim(path, create=True)
    assert claim is not None and path.exists()
    inside = locks.lock(path, inside_claim=True)
    assert locks.lock(path, inside_claim=True) is None  # one at a time
    _held_until_both_go(path, claim, inside)  # a lock outside the claim is refused meanwhile


def test_a_claim_keeps_other_processes_out_and_counts_its_handles(tmp_path):
    path = tmp_path / "dev.img"
    c1 = locks.claim(path, create=True)
    c2 = locks.claim(path)  # this process again: counted
    assert not _another_process_can_lock(path)
    _held_until_both_go(path, c1, c2)


def test_a_file_locked_outside_a_claim_cannot_be_claimed(tmp_path):
    path = tmp_path / "dev.img"
    with locks.lock(path, create=True):
        assert locks.claim(path) is None
    # no claim of this file is left behind (other tests' claims may be live in this process)
    st = path.stat()
    assert (st.st_dev, st.st_ino) not in locks._claims


def test_a_forked_child_holds_none_of_its_parents_claims(tmp_path):
    """A child forked while the parent claims a file can neither claim it nor take a lock
    inside the parent's claim (two processes would write one device), and once the parent
    releases, the file is free although the child still runs."""
    path = tmp_path / "dev.img"
    claim = locks.claim(path, create=True)
    assert claim is not None
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then stay alive until told
        try:
            said = [locks.claim(path) is None, locks.lock(path, inside_claim=True) is None]
            os.write(w, bytes(said))
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(r, 2) == b"\x01\x01"  # both refused in the child
        claim.release()
        assert _another_process_can_lock(path)  # the child's copy holds nothing
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        for fd in (r, w, go_r, go_w):
            os.close(fd)
