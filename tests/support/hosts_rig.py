"""The multi-host rig: a fleet spread over network namespaces (``tests/support/netns.py``).

Two topologies (``Layout``):

* ``redis``: producers on host ``prod``, workers on ``work1`` and ``work2`` (more with
  ``workers``), the Redis primary on ``redis1`` and a replica on ``redis2``; Redis is
  broker and result backend, over ``rediss://`` with the rig's CA when ``tls``.
* ``sentinel``: the same hosts, and three Sentinels (on ``redis1``, ``redis2`` and
  ``prod``, quorum 2) monitoring the primary as ``mymaster``; the fleet's broker and
  result backend are ``sentinel://`` URLs naming the three (producers and workers on
  other hosts reach them over the bridge), so a replica the Sentinels promote is
  followed by the fleet itself. With ``tls``, servers, replication and Sentinels speak
  TLS only, and the ``sentinel://`` URLs name the rig's CA.
* ``rabbitmq``: a three-node RabbitMQ cluster (``rmq1``-``rmq3``, the skill queues are
  quorum queues, replicated on all three) as broker, every node in the workers' and
  producers' URL (kombu fails over along the list), and Redis on ``redis1`` for results.

The tests and the soak sit in the root namespace (the bridge's ``.1``): they read
results and send probes from there, and start the load (``tests/support/hosts_load.py``)
on ``prod``. Every process is started in a host and ended with it: ``close`` tears the
network down by namespace, and a crashed run's leftovers go at the next start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cleveragents.client import SkillClient
from cleveragents.settings import Settings
from tests.conftest import worker_env
from tests.support.netns import Host, Network
from tests.support.procs import REPO
from tests.support.rig_ca import RigCA, make_ca

REDIS_PORT = 6379
REDIS_TLS_PORT = 6380
SENTINEL_PORT = 26379
AMQP_PORT = 5672
#: RabbitMQ's TLS port on each rig node.
AMQPS_PORT = 5671
#: The hosts a Sentinel runs on (the sentinel topology): any one lost leaves a majority.
SENTINEL_HOSTS = ("redis1", "redis2", "prod")
#: The name the Sentinels monitor the primary under (CLEVERAGENTS_SENTINEL_MASTER).
SENTINEL_MASTER = "mymaster"


@dataclass(frozen=True)
class Layout:
    """Which fleet the rig builds."""

    topology: str = "redis"  # or "sentinel", "rabbitmq"
    workers: int = 2  # worker hosts
    concurrency: int = 2
    tls: bool = False
    recovery_s: float = 4.0
    replica: bool = True  # a Redis replica on redis2 (the redis and sentinel topologies)

    def __post_init__(self) -> None:
        if self.topology == "sentinel" and not self.replica:
            raise ValueError("the sentinel topology runs with a replica")

    @property
    def sentinels(self) -> bool:
        """Three Sentinels, and the fleet on ``sentinel://`` URLs."""
        return self.topology == "sentinel"

    def host_names(self) -> list[str]:
        workers = [f"work{n}" for n in range(1, self.workers + 1)]
        if self.topology == "rabbitmq":
            return ["prod", *workers, "redis1", "rmq1", "rmq2", "rmq3"]
        return ["prod", *workers, "redis1", *(["redis2"] if self.replica else [])]


@dataclass
class RigWorker:
    """A worker process on a host."""

    host: Host
    folder: Path
    proc: Any = None

    @property
    def log(self) -> Path:
        return self.folder / "worker.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``predicate`` until true, or raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(interval)  # a bounded poll (timeout)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class HostsRig:
    """The fleet of one ``Layout`` on a fresh network; ``close`` ends all of it."""

    root: Path
    layout: Layout
    net: Network = field(init=False)
    ca: RigCA | None = field(init=False, default=None)
    workers: list[RigWorker] = field(init=False, default_factory=list)
    clients: list[SkillClient] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ledger = self.root / "ledger"
        self.ledger.touch()
        self.net = Network()
        try:
            for name in self.layout.host_names():
                self.net.add_host(name)
            if self.layout.tls:
                hosts = list(self.net.hosts.values())
                self.ca = make_ca(self.root / "ca", [h.name for h in hosts],
                                  [h.address for h in hosts] + [self.net.console])
        except BaseException:
            self.net.close()
            raise

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    # ------------------------------------------------------------------ services
    def start_services(self) -> None:
        """Redis (and its replica, Sentinels), and the RabbitMQ cluster where laid out."""
        self.start_redis("redis1")
        if self.layout.topology in ("redis", "sentinel") and self.layout.replica:
            self.start_redis("redis2", replica_of=self.host("redis1"))
        if self.layout.sentinels:
            from tests.support.hosts_services import start_sentinels

            start_sentinels(self)
        if self.layout.topology == "rabbitmq":
            from tests.support.hosts_services import start_rabbit_cluster

            start_rabbit_cluster(self, ["rmq1", "rmq2", "rmq3"])

    def start_redis(self, name: str, *, replica_of: Host | None = None) -> None:
        from tests.support.hosts_services import redis_args

        host = self.host(name)
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        host.start(redis_args(self, folder, replica_of), log=folder / "redis.log")
        wait_for(lambda: self._redis_at(host).ping(), 20, f"redis-server on {name}")

    def _redis_at(self, host: Host) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url(host), socket_timeout=3,
                                    socket_connect_timeout=3)

    def redis_url(self, host: Host | None = None) -> str:
        """The URL of the Redis on ``host`` (the primary, redis1, by default)."""
        host = host or self.host("redis1")
        if self.ca is None:
            return f"redis://{host.address}:{REDIS_PORT}/0"
        return (f"rediss://{host.address}:{REDIS_TLS_PORT}/0?ssl_cert_reqs=required"
                f"&ssl_ca_certs={self.ca.ca}")

    def sentinel_url(self) -> str:
        """The three Sentinels as Celery and kombu name them (``sentinel://a;...``)."""
        query = f"?ssl_ca_certs={self.ca.ca}&ssl_cert_reqs=required" if self.ca else ""
        return ";".join(f"sentinel://{self.host(n).address}:{SENTINEL_PORT}/0{query}"
                        for n in SENTINEL_HOSTS)

    def primary(self, skip: str | None = None) -> Host:
        """The host of the primary a Sentinel that answers names now (asking none on
        host ``skip``)."""
        from tests.support.hosts_services import primary_address

        address = primary_address(self, skip)
        return next(h for h in self.net.hosts.values() if h.address == address)

    def broker_url(self) -> str:
        """The workers' and producers' broker: Redis (or its Sentinels), or every
        RabbitMQ node in turn."""
        if self.layout.sentinels:
            return self.sentinel_url()
        if self.layout.topology != "rabbitmq":
            return self.redis_url()
        # With ``tls``, amqps:// checked against the rig's CA (broker/url_tls.py), as
        # Redis (results) is on rediss://.
        if self.ca is not None:
            query = f"?ssl_ca_certs={self.ca.ca}&ssl_cert_reqs=required"
            urls = [f"amqps://guest:guest@{self.host(n).address}:{AMQPS_PORT}//{query}"
                    for n in ("rmq1", "rmq2", "rmq3")]
        else:
            urls = [f"amqp://guest:guest@{self.host(n).address}:{AMQP_PORT}//"
                    for n in ("rmq1", "rmq2", "rmq3")]
        return ";".join(urls)

    def env(self) -> dict[str, str]:
        """The fleet's CLEVERAGENTS_* settings (producers' and workers' alike)."""
        backend = self.sentinel_url() if self.layout.sentinels else self.redis_url()
        env = worker_env(self.broker_url(), backend=backend,
                         CLEVERAGENTS_RECOVERY_S=f"{self.layout.recovery_s:g}")
        if self.layout.sentinels:
            env["CLEVERAGENTS_SENTINEL_MASTER"] = SENTINEL_MASTER
        return env

    # ------------------------------------------------------------------ workers
    def start_worker(self, name: str, timeout: float = 90) -> RigWorker:
        """A ``celery -A worker worker`` on host ``name``, waited for until ready."""
        host = self.host(name)
        folder = self.root / f"{name}-{len(self.workers)}"
        folder.mkdir()
        ready = folder / "ready"
        env = {**self.env(), "CLEVERAGENTS_HOME": str(folder / "home"),
               "CLEVERAGENTS_READY_FILE": str(ready), "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "celery", "-A", "worker", "worker", "--loglevel", "INFO",
                "--concurrency", str(self.layout.concurrency), "--hostname",
                f"{folder.name}@{name}", "--without-mingle", "--without-gossip"]
        worker = RigWorker(host, folder)
        worker.proc = host.start(argv, env=fleet_process_env(env), log=worker.log, cwd=REPO)
        self.workers.append(worker)
        wait_for(lambda: ready.exists() or not worker.alive(), timeout, f"a worker on {name}")
        if not worker.alive():
            raise RuntimeError(f"the worker on {name} exited:\n{worker.log.read_text()[-3000:]}")
        return worker

    def client(self) -> SkillClient:
        """A producer client in the root namespace (the console)."""
        settings = Settings.from_env({**self.env(),
                                      "CLEVERAGENTS_HOME": str(self.root / "console")})
        client = SkillClient(settings=settings)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()
        self.net.close()


def fleet_process_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a rig process: this one's without CLEVERAGENTS_*, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    return {**base, **env}


@contextlib.contextmanager
def hosts_rig(root: Path, layout: Layout) -> Iterator[HostsRig]:
    """A started ``HostsRig`` (services up), closed whatever happens."""
    rig = HostsRig(root, layout)
    try:
        rig.start_services()
        yield rig
    finally:
        rig.close()
        shutil.rmtree(root / "ca", ignore_errors=True)


def rig_with_workers(factory: Any, layout: Layout) -> Iterator[HostsRig]:
    """A module's rig (``factory``: pytest's ``tmp_path_factory``) with a worker on
    ``work1`` and on ``work2``; skips the module only where namespaces cannot be made."""
    import pytest  # a test helper: pytest only when asked

    from tests.support import netns

    missing = netns.missing()
    if missing is not None:
        pytest.skip(f"the multi-host rig needs network namespaces: {missing}")
    with hosts_rig(Path(factory.mktemp(layout.topology)), layout) as made:
        made.start_worker("work1")
        made.start_worker("work2")
        yield made
