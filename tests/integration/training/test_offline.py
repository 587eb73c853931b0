"""Offline: with HF_HUB_OFFLINE=1 and the config's own W&B default (``logger.wandb.offline:
true``, no ``WANDB_*`` variable set), a full training run on local files makes no network
connection.

The run is a subprocess of ``scripts/train.py`` with the default loggers (W&B + CSV). Every
``WANDB_*`` variable is removed from its environment, so only the config keeps W&B offline,
and every proxy variable and W&B's server address point at an unreachable documentation
address (192.0.2.1, TEST-NET-1), so a client that did go online could not reach anything.
A ``sitecustomize.py`` put first on PYTHONPATH guards the sockets of every Python process of
the run (the script and any Python children): a connection, datagram or name lookup to
anything but loopback or a Unix socket is recorded in a file and fails. W&B's service is a
compiled program (``wandb-core``) that Python patches cannot see, so the test also samples
the TCP/UDP sockets of the whole process tree from ``/proc`` while the run lasts and fails on
any remote address that is not loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from train_utils import REPO, tiny_overrides, write_toy_corpus

GUARD = textwrap.dedent(
    """
    # Installed by tests/integration/training/test_offline.py: record and refuse non-loopback network use.
    import ipaddress, os, socket

    _LOG = os.environ["LITMT_NET_LOG"]
    _LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", ""}


    def _loopback(host):
        if host is None:
            return True
        host = host.decode() if isinstance(host, bytes) else str(host)
        if host in _LOCAL_NAMES:
            return True
        try:
            return ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            return False


    def _refuse(what):
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {what}\\n")
        raise OSError(101, f"network disabled by the litmt offline test: {what}")


    def _check(sock, address, what):
        if sock.family == getattr(socket, "AF_UNIX", None):
            return
        host = address[0] if isinstance(address, tuple) else address
        if not _loopback(host):
            _refuse(f"{what} {address!r}")


    _connect, _connect_ex, _sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
    _getaddrinfo, _create_connection = socket.getaddrinfo, socket.create_connection


    def connect(self, address):
        _check(self, address, "connect")
        return _connect(self, address)


    def connect_ex(self, address):
        _check(self, address, "connect_ex")
        return _connect_ex(self, address)


    def sendto(self, data, *args):
        _check(self, args[-1], "sendto")
        return _sendto(self, data, *args)


    def getaddrinfo(host, *args, **kwargs):
        if not _loopback(host):
            _refuse(f"getaddrinfo {host!r}")
        return _getaddrinfo(host, *args, **kwargs)


    def create_connection(address, *args, **kwargs):
        if not _loopback(address[0]):
            _refuse(f"create_connection {address!r}")
        return _create_connection(address, *args, **kwargs)


    socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = connect, connect_ex, sendto
    socket.getaddrinfo, socket.create_connection = getaddrinfo, create_connection
    """
)


# An address reserved for documentation (RFC 5737): nothing answers there.
UNREACHABLE = "http://192.0.2.1:9"
PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


def _children(pid: int) -> set[int]:
    """`pid` and all its descendants (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(parents.get(p, []))
    return tree


def _socket_inodes(pids: set[int]) -> dict[str, int]:
    inodes = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    return inodes


def _remote(hex_addr: str) -> str:
    """The IP of a /proc/net/{tcp,udp}[6] remote address, e.g. '0100007F:1F90' -> 127.0.0.1."""
    import ipaddress

    ip = bytes.fromhex(hex_addr.split(":")[0])
    if len(ip) == 4:
        return str(ipaddress.IPv4Address(ip[::-1]))
    words = b"".join(ip[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def _peers(pid: int) -> tuple[set[str], set[str]]:
    """Non-loopback remote addresses of the inet sockets of `pid`'s process tree right now,
    and the names of the tree's programs that hold sockets of any kind (to show the sampling
    sees them: W&B's service talks to the script over a Unix socket)."""
    import ipaddress

    inodes = _socket_inodes(_children(pid))
    holders = set()
    for owner in set(inodes.values()):
        try:
            holders.add(
                Path(Path(f"/proc/{owner}/cmdline").read_bytes().split(b"\0")[0].decode()).name
            )
        except OSError:
            continue
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] not in inodes:
                continue
            ip = ipaddress.ip_address(_remote(cols[2]))
            mapped = getattr(ip, "ipv4_mapped", None)
            if not (ip.is_unspecified or ip.is_loopback or (mapped and mapped.is_loopback)):
                found.add(f"{table} {ip} (pid {inodes[cols[9]]})")
    return found, holders


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_a_full_offline_run_on_local_files_makes_no_network_connection(tmp_path):
    pytest.importorskip("wandb")
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 10, "test": 10})
    guard_dir = tmp_path / "guard"
    guard_dir.mkdir()
    (guard_dir / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "network_attempts.log"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("WANDB_")}
    env |= {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(guard_dir), os.environ.get("PYTHONPATH")])),
        "LITMT_NET_LOG": str(log),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_BASE_URL": UNREACHABLE,  # W&B's server, were it contacted (not a mode setting)
        **{k: UNREACHABLE for k in PROXY_VARIABLES},
    }
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"  # W&B's local service
    overrides = [
        o for o in tiny_overrides(corpus, tmp_path) if o != "logger=csv"
    ]  # default loggers
    cmd = [
        sys.executable,
        "scripts/train.py",
        *overrides,
        "trainer.max_epochs=1",
        "test_after_training=true",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: set[str] = set()
    holders: set[str] = set()

    def watch() -> None:
        while proc.poll() is None:
            external, names = _peers(proc.pid)
            seen.update(external)
            holders.update(names)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
        watcher.join(timeout=10)
    assert log.read_text() == "", f"network use attempted:\n{log.read_text()}"
    assert not seen, f"sockets to non-loopback peers: {sorted(seen)}"
    assert proc.returncode == 0, stderr[-3000:]
    assert "test/bleu" in stdout  # the run went through to the test split
    run = tmp_path / "run"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert any(run.rglob("metrics.csv"))
    assert any((run / "wandb").glob("offline-run-*")), "W&B did not log offline"
    assert not any((run / "wandb").glob("run-*")), "W&B started an online run"
    assert "wandb-core" in holders, holders  # the sampling saw W&B's compiled service


def test_the_guard_blocks_and_records_external_connections(tmp_path):
    """Control: the injected guard really sees and refuses a connection attempt."""
    guard_dir = tmp_path / "guard"
    guard_dir.mkdir()
    (guard_dir / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "attempts.log"
    code = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(0.2)\n"
        "try:\n    s.connect(('192.0.2.1', 80))\nexcept OSError as e:\n    print(e)\n"
        "try:\n    socket.getaddrinfo('huggingface.co', 443)\nexcept OSError as e:\n    print(e)\n"
        "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()\n"
        "socket.create_connection(srv.getsockname()).close()\n"  # loopback is allowed
    )
    env = {**os.environ, "PYTHONPATH": str(guard_dir), "LITMT_NET_LOG": str(log)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "network disabled by the litmt offline test" in proc.stdout
    attempts = log.read_text().splitlines()
    assert len(attempts) == 2
    assert "connect ('192.0.2.1', 80)" in attempts[0] and "huggingface.co" in attempts[1]
