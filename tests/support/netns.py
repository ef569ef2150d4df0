"""Hosts in network namespaces: a private network of "machines" on one Linux box, for the
multi-host rig (``tests/support/hosts_rig.py``, ``benchmarks/rig.py``).

A ``Network`` is one bridge in the root namespace with a private /24 of
``10.249.0.0/16`` (the root namespace is ``.1`` on it: the operator's console, where
the tests and the soak sit); each ``Host`` is a network namespace joined to the bridge
by a veth pair, with its own loopback, its own address, its own ``/etc/hosts`` (every
host of the network by name, bind-mounted by ``ip netns exec``) and, for every process
started in it, its own host name (a UTS namespace). Processes share the machine's
files and process ids, so a ledger file is one file for every host.

Everything one run makes carries its run's name, ``<prefix><run>``: the namespaces
(``<prefix><run>-<host>``), the bridge (``<prefix><run>b``), the veths
(``<prefix><run>v<n>``) and a state folder ``/run/<prefix>/<run>`` that names the
owning process. ``Network.close`` kills every process of every namespace (found by
namespace, ``ip netns pids``, not by name) and removes them; ``cleanup_leftovers``
does the same for every run of a prefix whose owner is dead (a crashed test, a
``kill -9`` of the soak).

Faults: ``Host.lose`` (its link down, then every process in it ``SIGKILL``ed: the
peers never hear a FIN or RST, their connections stay half-open) and
``Host.partition``/``Host.heal`` (its veth out of the bridge and back: both ends keep
their carrier and their sockets, packets go nowhere).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import process_alive

#: Every rig's names start with this (a run adds four hex digits).
PREFIX = "carig"
#: The rig's addresses: one /24 of this per run, picked free.
SUPERNET = ipaddress.IPv4Network("10.249.0.0/16")
#: Where each run keeps its owner's process id and its hosts' files.
STATE_ROOT = Path("/run")


def missing() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the `ip` (iproute2) and `unshare` commands are needed for network namespaces"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def namespace_pids(ns: str) -> list[int]:
    """Every process whose network namespace is ``ns``."""
    done = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()]


def kill_namespace(ns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in ``ns`` until none is left (a fork during the kill too)."""
    deadline = time.monotonic() + timeout
    while pids := [p for p in namespace_pids(ns) if process_alive(p)]:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of {ns} outlive SIGKILL: {pids}")
        time.sleep(0.02)  # the kernel removing killed processes; bounded by deadline


@dataclass
class Host:
    """One "machine": a network namespace on the rig's bridge."""

    net: Network
    name: str  # its host name, and its name in every host's /etc/hosts
    index: int
    address: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return f"{self.net.run_name}-{self.name}"

    @property
    def veth(self) -> str:
        """The root end of its veth pair, on the bridge."""
        return f"{self.net.run_name}v{self.index}"

    def exec_args(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside this host, under its own host name."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", script,
                self.name, *argv]

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        log: Path | None = None, cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in this host (its own session), with ``env`` as its whole
        environment when given; output to ``log``."""
        out = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                self.exec_args(argv), env=None if env is None else dict(env), cwd=cwd,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if log is not None and not isinstance(out, int):
                out.close()
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in this host to its end; its output captured."""
        return subprocess.run(self.exec_args(argv), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def pids(self) -> list[int]:
        return namespace_pids(self.ns)

    def owns(self, pid: int) -> bool:
        """True when process ``pid`` runs in this host's network namespace."""
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{self.ns}").st_ino
        except OSError:
            return False

    def link_down(self) -> None:
        """Both ends of its veth down: it and the rest stop hearing each other."""
        _ip("link", "set", self.veth, "down")
        _ip("netns", "exec", self.ns, "ip", "link", "set", "eth0", "down")

    def lose(self) -> None:
        """The machine vanishes: its link down first (no FIN, no RST goes out), then every
        process in it SIGKILLed. Peers keep half-open connections to it."""
        self.link_down()
        kill_namespace(self.ns)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()

    def revive(self) -> None:
        """A lost machine boots again: its link up, with nothing running."""
        _ip("netns", "exec", self.ns, "ip", "link", "set", "eth0", "up")
        _ip("link", "set", self.veth, "up")

    def partition(self) -> None:
        """Cut it off: its veth out of the bridge (both ends keep carrier and sockets)."""
        _ip("link", "set", self.veth, "nomaster")

    def heal(self) -> None:
        """Join it to the bridge again."""
        _ip("link", "set", self.veth, "master", self.net.bridge)
        _ip("link", "set", self.veth, "up")


class Network:
    """A bridge and its hosts, all named after one run; ``close`` removes everything."""

    def __init__(self, *, prefix: str = PREFIX, run: str | None = None) -> None:
        cleanup_leftovers(prefix)
        self.prefix = prefix
        self.run = run or secrets.token_hex(2)
        self.run_name = f"{prefix}{self.run}"
        self.bridge = f"{self.run_name}b"
        self.state = STATE_ROOT / prefix / self.run
        self.hosts: dict[str, Host] = {}
        self.subnet = _free_subnet()
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "owner").write_text(f"{os.getpid()}\n")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.console}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    @property
    def console(self) -> str:
        """The root namespace's address on the bridge (where the tests run)."""
        return str(self.subnet.network_address + 1)

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, with loopback up and the next address."""
        index = len(self.hosts) + 2
        host = Host(self, name, index, str(self.subnet.network_address + index))
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
        _ip("link", "set", f"{host.veth}p", "netns", host.ns)
        inside = ("ip", "netns", "exec", host.ns, "ip")
        _ip(*inside[1:], "link", "set", "lo", "up")
        _ip(*inside[1:], "link", "set", f"{host.veth}p", "name", "eth0")
        _ip(*inside[1:], "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip(*inside[1:], "link", "set", "eth0", "up")
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        self.hosts[name] = host
        self._write_hosts_files()
        return host

    def _write_hosts_files(self) -> None:
        lines = ["127.0.0.1 localhost"]
        lines += [f"{h.address} {h.name}" for h in self.hosts.values()]
        text = "\n".join(lines) + "\n"
        for host in self.hosts.values():
            folder = Path("/etc/netns") / host.ns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(text)

    def close(self) -> None:
        """Kill every process of every host, remove namespaces, veths, bridge and files."""
        teardown(self.prefix, self.run)
        for host in self.hosts.values():
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of ``SUPERNET`` that no address or route of the root namespace is in."""
    used = _ip("-4", "route", "show").stdout + _ip("-4", "addr", "show").stdout
    taken = set()
    for word in used.split():
        try:
            net = ipaddress.ip_interface(word).network
        except ValueError:
            continue
        if net.prefixlen >= 24:
            taken.add(net.supernet(new_prefix=24) if net.prefixlen > 24 else net)
    for subnet in SUPERNET.subnets(new_prefix=24):
        if subnet not in taken:
            return subnet
    raise RuntimeError(f"no free /24 left in {SUPERNET}")


def teardown(prefix: str, run: str) -> None:
    """Remove everything of run ``run``: processes by namespace, then names."""
    run_name = f"{prefix}{run}"
    names = [n for n in _namespaces() if n.startswith(f"{run_name}-")]
    for ns in names:
        kill_namespace(ns)
    for ns in names:
        _ip("netns", "del", ns, check=False)  # its veth ends go with it
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    for link in _links():
        if link.startswith(run_name):
            _ip("link", "del", link, check=False)
    shutil.rmtree(STATE_ROOT / prefix / run, ignore_errors=True)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]


def _links() -> list[str]:
    out = _ip("-o", "link", "show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def cleanup_leftovers(prefix: str = PREFIX) -> list[str]:
    """Tear down every run of ``prefix`` whose owner is dead; return their run names."""
    runs = {n[len(prefix):].split("-")[0] for n in _namespaces() if n.startswith(prefix)}
    runs |= {link[len(prefix):len(prefix) + 4] for link in _links() if link.startswith(prefix)}
    with contextlib.suppress(OSError):
        runs |= {p.name for p in (STATE_ROOT / prefix).iterdir()}
    removed = []
    for run in sorted(runs):
        owner = STATE_ROOT / prefix / run / "owner"
        with contextlib.suppress(OSError, ValueError):
            if process_alive(int(owner.read_text().split()[0])):
                continue
        teardown(prefix, run)
        removed.append(f"{prefix}{run}")
    return removed
