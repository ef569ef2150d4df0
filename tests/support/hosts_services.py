"""The servers of the multi-host rig (``tests/support/hosts_rig.py``): redis-server (primary,
replica, Sentinels) and a RabbitMQ cluster, each started inside its host."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from tests.support.netns import Host, kill_namespace

if TYPE_CHECKING:
    from tests.support.hosts_rig import HostsRig

#: RabbitMQ's own scripts, not Debian's wrappers in /usr/sbin (those switch to the
#: ``rabbitmq`` user, whose HOME holds another Erlang cookie). The machine's own node on
#: 127.0.0.1 is never touched: the rig's nodes run in their own namespaces, with their
#: own names, folders, ports and cookie.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
RABBITMQ_SERVER = str(RABBITMQ_BIN / "rabbitmq-server")
RABBITMQCTL = str(RABBITMQ_BIN / "rabbitmqctl")


def redis_args(rig: HostsRig, folder: Path, replica_of: Host | None) -> list[str]:
    """A redis-server with an append-only file (fsync always), on TLS when the rig is."""
    from tests.support.hosts_rig import REDIS_PORT, REDIS_TLS_PORT

    # A replica's sync at once (Redis waits 5 s for more replicas by default).
    args = ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", str(folder),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--repl-diskless-sync-delay", "0"]
    if rig.ca is None:
        args += ["--port", str(REDIS_PORT)]
    else:
        args += ["--port", "0", "--tls-port", str(REDIS_TLS_PORT),
                 "--tls-cert-file", str(rig.ca.cert), "--tls-key-file", str(rig.ca.key),
                 "--tls-ca-cert-file", str(rig.ca.ca), "--tls-auth-clients", "no",
                 "--tls-replication", "yes"]
    if replica_of is not None:
        port = REDIS_PORT if rig.ca is None else REDIS_TLS_PORT
        args += ["--replicaof", replica_of.address, str(port)]
    return args


def sentinel_conf(rig: HostsRig, name: str) -> Path:
    """The Sentinel of host ``name``'s config file, written once: the Sentinel rewrites it
    as it learns (peers, epochs, the primary now), and starts again on it after a reboot."""
    from tests.support.hosts_rig import SENTINEL_MASTER, SENTINEL_PORT

    folder = rig.root / f"sentinel-{name}"
    folder.mkdir(exist_ok=True)
    conf = folder / "sentinel.conf"
    if not conf.exists():
        primary = rig.host("redis1")
        listen = [f"port {SENTINEL_PORT}"]
        if rig.ca is not None:  # TLS only, to clients and to the servers it watches
            listen = ["port 0", f"tls-port {SENTINEL_PORT}", f"tls-cert-file {rig.ca.cert}",
                      f"tls-key-file {rig.ca.key}", f"tls-ca-cert-file {rig.ca.ca}",
                      "tls-auth-clients no", "tls-replication yes"]
        conf.write_text("\n".join([
            *listen, "protected-mode no", f"dir {folder}",
            f"sentinel monitor {SENTINEL_MASTER} {primary.address} {redis_port(rig)} 2",
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} {SENTINEL_DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SENTINEL_MASTER} 10000",
            f"sentinel parallel-syncs {SENTINEL_MASTER} 1",
        ]) + "\n")
    return conf


#: A primary silent this long is judged down (production: 5000, docs/deployment.md).
SENTINEL_DOWN_AFTER_MS = 3000


def start_sentinel(rig: HostsRig, name: str) -> None:
    """The Sentinel of host ``name`` (started again on its own config after a reboot)."""
    from tests.support.hosts_rig import SENTINEL_PORT, wait_for

    conf = sentinel_conf(rig, name)
    host = rig.host(name)
    host.start(["redis-server", str(conf), "--sentinel"], log=conf.parent / "sentinel.log")
    ping = ["redis-cli", *_cli_tls(rig), "-p", str(SENTINEL_PORT), "ping"]
    wait_for(lambda: "PONG" in host.run(ping).stdout, 20, f"sentinel on {name}")


def start_sentinels(rig: HostsRig) -> None:
    """Three Sentinels watching redis1 as ``mymaster`` (quorum 2), on ``SENTINEL_HOSTS``,
    waited for until they know each other and the replica."""
    from tests.support.hosts_rig import SENTINEL_HOSTS, wait_for

    for name in SENTINEL_HOSTS:
        start_sentinel(rig, name)
    wait_for(lambda: quorum_ok(rig), 30,
             "three Sentinels that know each other (SENTINEL CKQUORUM)", interval=0.5)
    await_replica(rig)


def _sentinels(rig: HostsRig, skip: str | None = None) -> list[redis.Redis]:
    """Clients of the Sentinels (but the one on host ``skip``: a host lost)."""
    from tests.support.hosts_rig import SENTINEL_HOSTS, SENTINEL_PORT

    return [redis.Redis(host=rig.host(n).address, port=SENTINEL_PORT, socket_timeout=2,
                        socket_connect_timeout=2, decode_responses=True, **_client_tls(rig))
            for n in SENTINEL_HOSTS if n != skip]


def redis_port(rig: HostsRig) -> int:
    """The port the rig's Redis servers listen on (TLS only with the rig's CA)."""
    from tests.support.hosts_rig import REDIS_PORT, REDIS_TLS_PORT

    return REDIS_PORT if rig.ca is None else REDIS_TLS_PORT


def _client_tls(rig: HostsRig) -> dict[str, Any]:
    """redis-py's options for the rig's servers and Sentinels."""
    return {} if rig.ca is None else {"ssl": True, "ssl_ca_certs": str(rig.ca.ca)}


def _cli_tls(rig: HostsRig) -> list[str]:
    """redis-cli's options for the same."""
    return [] if rig.ca is None else ["--tls", "--cacert", str(rig.ca.ca)]


def quorum_ok(rig: HostsRig, usable: int = 3) -> bool:
    """True when prod's Sentinel says ``usable`` Sentinels can authorize a failover."""
    from tests.support.hosts_rig import SENTINEL_MASTER, SENTINEL_PORT

    ask = ["redis-cli", *_cli_tls(rig), "-p", str(SENTINEL_PORT), "sentinel", "ckquorum",
           SENTINEL_MASTER]
    return rig.host("prod").run(ask).stdout.startswith(f"OK {usable} usable")


def primary_address(rig: HostsRig, skip: str | None = None) -> str:
    """The primary's address as the first Sentinel that answers names it (asking none on
    host ``skip``)."""
    from tests.support.hosts_rig import SENTINEL_MASTER

    for client in _sentinels(rig, skip):
        with contextlib.suppress(redis.RedisError), client:
            found = client.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
            if isinstance(found, tuple | list) and found:
                return str(found[0])
    raise RuntimeError("no Sentinel answers")


def await_replica(rig: HostsRig, timeout: float = 60) -> None:
    """Wait until the primary the Sentinels name has a replica in sync, and every Sentinel
    that answers knows a replica that is up (a failover could then promote it)."""
    from tests.support.hosts_rig import wait_for

    def whole() -> bool:
        primary = rig.primary()
        with redis.Redis(host=primary.address, port=redis_port(rig), socket_timeout=2,
                         **_client_tls(rig)) as client:
            info = client.info("replication")
        linked = info.get("role") == "master" and int(info.get("connected_slaves", 0)) >= 1
        return linked and info.get("slave0", {}).get("state") == "online" and _replica_seen(rig)

    wait_for(whole, timeout, "the primary's replica in sync, known to the Sentinels",
             interval=0.5)


def _replica_seen(rig: HostsRig) -> bool:
    from tests.support.hosts_rig import SENTINEL_MASTER

    answered = 0
    for client in _sentinels(rig):
        with contextlib.suppress(redis.RedisError), client:
            replicas = client.sentinel_slaves(SENTINEL_MASTER)
            answered += 1
            if not any(not r.get("is_sdown") and not r.get("is_disconnected")
                       and r.get("master-link-status") == "ok" for r in replicas):
                return False
    return answered > 0


def _rabbit_files(rig: HostsRig, name: str, nodes: list[str]) -> dict[str, str]:
    """A node's folder, cookie, config and environment; returns the environment."""
    folder = rig.root / name
    (folder / "home").mkdir(parents=True, exist_ok=True)
    cookie = folder / "home" / ".erlang.cookie"
    cookie.write_text(ERLANG_COOKIE_TEXT)
    cookie.chmod(0o400)
    config = [
        "listeners.tcp.default = 5672",
        "loopback_users = none",  # guest from other hosts: the rig's own network only
        "cluster_formation.peer_discovery_backend = classic_config",
        *(f"cluster_formation.classic_config.nodes.{i} = rabbit@{n}"
          for i, n in enumerate(nodes, 1)),
        "cluster_partition_handling = pause_minority",
        # Peers notice a lost node within 10-14 s, not 60-75 s: a node lost and started
        # again within the default tick found its peers still holding its old connection
        # and waited for its Mnesia tables for minutes (the first 30-minute soak).
        "net_ticktime = 10",
    ]
    if rig.ca is not None:
        config += ["listeners.ssl.default = 5671", f"ssl_options.cacertfile = {rig.ca.ca}",
                   f"ssl_options.certfile = {rig.ca.cert}", f"ssl_options.keyfile = {rig.ca.key}",
                   "ssl_options.verify = verify_none", "ssl_options.fail_if_no_peer_cert = false"]
    (folder / "rabbitmq.conf").write_text("\n".join(line for line in config if line) + "\n")
    (folder / "enabled_plugins").write_text("[].\n")
    (folder / "rabbitmq-env.conf").write_text("")
    return {
        "HOME": str(folder / "home"),
        "RABBITMQ_NODENAME": f"rabbit@{name}",
        "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
        "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(folder / "log"),
        "RABBITMQ_PID_FILE": str(folder / "rabbit.pid"),
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    }


ERLANG_COOKIE_TEXT = "CLEVERAGENTSRIGCOOKIE"


def rabbit_env(rig: HostsRig, name: str) -> dict[str, str]:
    """The environment ``rabbitmqctl`` and ``rabbitmq-server`` of node ``name`` need."""
    return _rabbit_files(rig, name, ["rmq1", "rmq2", "rmq3"])


def start_rabbit_node(rig: HostsRig, name: str) -> None:
    """Start (or start again, on its folders) the RabbitMQ node on host ``name``."""
    env = rabbit_env(rig, name)
    rig.host(name).start([RABBITMQ_SERVER], env=env, log=rig.root / name / "server.log")


def rabbitmqctl(rig: HostsRig, name: str, *args: str, timeout: float = 120) -> str:
    """``rabbitmqctl`` against node ``name``, run inside its host; its output."""
    env = rabbit_env(rig, name)
    host = rig.host(name)
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), RABBITMQCTL, "-n",
            f"rabbit@{name}", *args]
    done = host.run(argv, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {name}: {done.stderr[-800:]}")
    return done.stdout


def await_node(rig: HostsRig, name: str, timeout: float = 180) -> None:
    """Wait until node ``name`` has started (it registers with epmd first)."""
    from tests.support.hosts_rig import wait_for

    wait_for(lambda: rabbitmqctl(rig, name, "await_startup", "--timeout", "10", timeout=30)
             is not None, timeout, f"RabbitMQ node {name}", interval=1)


def restart_rabbit_node(rig: HostsRig, name: str) -> None:
    """Start node ``name`` again after its host was lost, once more if it does not come up
    (its peers may still have held its old connection)."""
    start_rabbit_node(rig, name)
    try:
        await_node(rig, name)
    except TimeoutError:
        print(f"RabbitMQ node {name} did not come back; starting it again", file=sys.stderr)
        kill_namespace(rig.host(name).ns)
        start_rabbit_node(rig, name)
        await_node(rig, name)


def start_rabbit_cluster(rig: HostsRig, names: list[str]) -> None:
    """The first node, then the others, which join it (classic peer discovery)."""
    start_rabbit_node(rig, names[0])
    await_node(rig, names[0])
    for name in names[1:]:
        start_rabbit_node(rig, name)
    for name in names[1:]:
        await_node(rig, name)
    status = rabbitmqctl(rig, names[0], "cluster_status", "--formatter", "json")
    missing = [n for n in names if f"rabbit@{n}" not in status]
    if missing:
        raise RuntimeError(f"RabbitMQ nodes {missing} did not join the cluster: {status}")
