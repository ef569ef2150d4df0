"""A private Redis Sentinel fleet on loopback: a primary, a replica, three Sentinels.

Every process is a ``redis-server`` on a free port (the Sentinels with ``--sentinel``),
started in its own session and killed by PID. The Sentinels judge a primary down
after ``DOWN_AFTER_MS`` and promote the replica; ``primary_port`` asks them which
server is the primary now. With ``tls`` every port speaks TLS only (a CA the fleet
makes), replication and the Sentinels' own traffic included.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.support.procs import free_port, kill_group, wait_until
from tests.support.rig_ca import RigCA, make_ca

__all__ = ["DOWN_AFTER_MS", "MASTER", "SentinelFleet", "sentinel_fleet"]

#: The name the Sentinels monitor the primary under (CLEVERAGENTS_SENTINEL_MASTER's default).
MASTER = "mymaster"
#: A primary that does not answer for this long is judged down (then a failover starts).
DOWN_AFTER_MS = 1000


class SentinelFleet:
    """A primary, a replica of it and three Sentinels monitoring it, in one folder."""

    def __init__(self, *, sentinels: int = 3, tls: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cleveragents-sentinel-"))
        self.ports = {"primary": free_port(), "replica": free_port()}
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ca: RigCA | None = None
        if tls:
            self.ca = make_ca(self.dir / "tls", ["localhost"], ["127.0.0.1"])

    @property
    def url(self) -> str:
        """The fleet as Celery and kombu name it: ``sentinel://h:p;sentinel://h:p;...``,
        with the CA in each part's ``ssl_*`` parameters when it speaks TLS."""
        query = f"?ssl_ca_certs={self.ca.ca}&ssl_cert_reqs=required" if self.ca else ""
        return ";".join(f"sentinel://127.0.0.1:{port}/0{query}" for port in self.sentinel_ports)

    def client(self, port: int, **options: object) -> redis.Redis:
        """A plain client of the server or Sentinel on ``port`` (over TLS with ``tls``)."""
        tls = {"ssl": True, "ssl_ca_certs": str(self.ca.ca)} if self.ca else {}
        return redis.Redis(port=port, **{"socket_timeout": 2, **tls, **options})  # type: ignore[arg-type]

    def _listen(self, port: int) -> list[str]:
        """A server's listening options: ``port``, in plain text or TLS only."""
        if self.ca is None:
            return ["--port", str(port)]
        files = ["--tls-cert-file", str(self.ca.cert), "--tls-key-file", str(self.ca.key)]
        files += ["--tls-ca-cert-file", str(self.ca.ca), "--tls-auth-clients", "no"]
        return ["--port", "0", "--tls-port", str(port), *files, "--tls-replication", "yes"]

    def start(self) -> SentinelFleet:
        # A replica's first sync at once (Redis waits 5 s for more replicas by default).
        self._server("primary", ["--repl-diskless-sync-delay", "0"])
        self._server("replica", ["--replicaof", "127.0.0.1", str(self.ports["primary"])])
        for n, port in enumerate(self.sentinel_ports):
            self._sentinel(n, port)
        replica = self.client(self.ports["replica"])
        wait_until(lambda: _linked(replica), 20, "the replica to sync with the primary")
        if self.sentinel_ports:
            wait_until(lambda: self._replicas_seen() >= 1, 20, "the Sentinels to see the replica")
        return self

    def _server(self, name: str, extra: list[str]) -> None:
        folder = self.dir / name
        folder.mkdir(exist_ok=True)
        port = self.ports[name]
        args = ["redis-server", *self._listen(port), "--bind", "127.0.0.1", "--dir", str(folder)]
        args += ["--save", "", "--appendonly", "yes", "--logfile", str(folder / "redis.log")]
        self._spawn(name, [*args, *extra])
        client = self.client(port)
        wait_until(lambda: _pings(client), 10, f"redis-server {name} on port {port}")

    def _sentinel(self, n: int, port: int) -> None:
        conf = self.dir / f"sentinel-{n}.conf"
        listen = self._listen(port)  # the same options, as configuration lines
        lines = "".join(f"{k[2:]} {v}\n" for k, v in zip(listen[::2], listen[1::2], strict=True))
        conf.write_text(
            f"{lines}bind 127.0.0.1\ndir {self.dir}\n"
            f"logfile {self.dir / f'sentinel-{n}.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.ports['primary']} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        self._spawn(f"sentinel-{n}", ["redis-server", str(conf), "--sentinel"])
        client = self.client(port)
        wait_until(lambda: _pings(client), 10, f"sentinel on port {port}")

    def _spawn(self, name: str, args: list[str]) -> None:
        self.procs[name] = subprocess.Popen(
            args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _replicas_seen(self) -> int:
        """How many replicas the Sentinel that knows fewest has found (0: none answers)."""
        seen = []
        for port in self.sentinel_ports:
            try:
                with self.client(port) as client:
                    seen.append(len(client.sentinel_slaves(MASTER)))
            except redis.RedisError:
                return 0
        return min(seen)

    def primary_port(self) -> int | None:
        """The primary's port as a Sentinel says it now (None: none answers)."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                with self.client(port) as client:
                    address = client.sentinel_get_master_addr_by_name(MASTER)
                if address:
                    return int(address[1])
        return None

    def primary(self) -> redis.Redis:
        """A plain client of the primary the Sentinels name now."""
        port = self.primary_port()
        assert port is not None, "no Sentinel answers"
        return self.client(port, socket_timeout=5)

    def kill_primary(self) -> float:
        """SIGKILL the primary (whichever server it is now); the time it was killed at."""
        port = self.primary_port()
        name = next(n for n, p in self.ports.items() if p == port)
        kill_group(self.procs[name], signal.SIGKILL)
        self.procs[name].wait(10)
        return time.monotonic()

    def freeze_primary(self) -> int:
        """SIGSTOP the primary, as a lost host is to its peers: its connections stay open
        and nothing answers on them (SIGCONT or ``close`` ends it); its port."""
        port = self.primary_port()
        assert port is not None, "no Sentinel answers"
        name = next(n for n, p in self.ports.items() if p == port)
        self.procs[name].send_signal(signal.SIGSTOP)
        return port

    def wait_failover(self, old_port: int, timeout: float = 30) -> float:
        """Wait until the Sentinels name another primary; the time they did."""
        wait_until(
            lambda: self.primary_port() not in (None, old_port), timeout, "a Sentinel failover"
        )
        return time.monotonic()

    def close(self) -> None:
        for proc in self.procs.values():
            kill_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _linked(replica: redis.Redis) -> bool:
    try:
        return replica.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def sentinel_fleet(*, sentinels: int = 3, tls: bool = False) -> Iterator[SentinelFleet]:
    """A started ``SentinelFleet``, every process killed by PID at the end."""
    fleet = SentinelFleet(sentinels=sentinels, tls=tls)
    try:
        yield fleet.start()
    finally:
        fleet.close()
