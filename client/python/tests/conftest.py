"""Fixtures: a real kvcached on a temporary socket, ready when it says so.

The daemon is $KVC_BUILD/kvcached (default: build/ of the source tree). It
runs with NOTIFY_SOCKET pointing at a datagram socket of ours; the fixture
waits for its READY=1 (no sleeps), and stops it with SIGTERM, expecting
exit status 0.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get("KVC_SRCDIR", os.path.abspath(os.path.join(HERE, "..", "..", "..")))
BUILD = os.environ.get("KVC_BUILD", os.path.join(SRCDIR, "build"))
if not os.path.isabs(BUILD):
    BUILD = os.path.join(SRCDIR, BUILD)
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(SRCDIR, "client", "python", "examples"))


class Daemon:
    """page=None: a daemon of arenas (each cache's page size its own)."""
    def __init__(self, pool="64MiB", page="64KiB", shm="8MiB", extra=()):
        self.dir = tempfile.mkdtemp(prefix="kvc-py-")
        self.sock = os.path.join(self.dir, "kvcached.sock")
        self.log = os.path.join(self.dir, "kvcached.log")
        notify = os.path.join(self.dir, "notify.sock")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        env = dict(os.environ, NOTIFY_SOCKET=notify, KVCACHED_TEST_AUDIT="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BUILD, "kvcached"), "--socket", self.sock, "--pool-bytes", pool,
                 *(("--page-bytes", page) if page else ()), "--shm-default-bytes", shm,
                 "--shm-max-bytes", "64MiB", "--tenant-max-caches", "0", *extra],
                stdout=subprocess.DEVNULL, stderr=log, env=env)
        ns.settimeout(10)
        try:
            while True:
                msg = ns.recv(4096).decode()
                if "READY=1" in msg.split("\n"):
                    break
        except socket.timeout:
            self.proc.kill()
            raise RuntimeError("kvcached did not report READY=1 within 10 s:\n" + self.logtext())
        finally:
            ns.close()

    def logtext(self):
        with open(self.log, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "killed after 20 s"
        return rc


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, f"kvcached exited with {rc}:\n{d.logtext()}"


@pytest.fixture(scope="module")
def shared_daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, f"kvcached exited with {rc}:\n{d.logtext()}"


@pytest.fixture
def client(shared_daemon):
    import kvcache
    with kvcache.Client(socket=shared_daemon.sock, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def arena_daemon():
    """A daemon of arenas (no page_bytes): block tables, arena views."""
    d = Daemon(pool="128MiB", page=None, shm="8MiB")
    yield d
    rc = d.stop()
    assert rc == 0, f"kvcached exited with {rc}:\n{d.logtext()}"


@pytest.fixture
def arena_client(arena_daemon):
    import kvcache
    with kvcache.Client(socket=arena_daemon.sock, timeout=10) as c:
        yield c
