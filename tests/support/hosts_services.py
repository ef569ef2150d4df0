"""The servers of the multi-host rig (``tests/support/hosts_rig.py``): redis-server (primary,
replica, Sentinels) and a RabbitMQ cluster, each started inside its host."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

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

    args = ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", str(folder),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
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


def start_sentinels(rig: HostsRig) -> None:
    """SENTINEL HOOK: three Sentinels watching redis1 as ``mymaster`` (quorum 2), on
    redis1, redis2 and prod. Nothing in the product follows them until ``sentinel://``
    URLs land (issue 49, its other half); the fleet is given the primary's URL meanwhile."""
    from tests.support.hosts_rig import SENTINEL_PORT, wait_for

    primary = rig.host("redis1")
    for name in ("redis1", "redis2", "prod"):
        folder = rig.root / f"sentinel-{name}"
        folder.mkdir(exist_ok=True)
        conf = folder / "sentinel.conf"
        port = "6379" if rig.ca is None else "6380"
        lines = [f"port {SENTINEL_PORT}", "protected-mode no", f"dir {folder}",
                 f"sentinel monitor mymaster {primary.address} {port} 2",
                 "sentinel down-after-milliseconds mymaster 3000",
                 "sentinel failover-timeout mymaster 10000"]
        if rig.ca is not None:
            lines += [f"tls-cert-file {rig.ca.cert}", f"tls-key-file {rig.ca.key}",
                      f"tls-ca-cert-file {rig.ca.ca}", "tls-replication yes"]
        conf.write_text("\n".join(lines) + "\n")
        host = rig.host(name)
        host.start(["redis-server", str(conf), "--sentinel"], log=folder / "sentinel.log")
        wait_for(lambda h=host: "PONG" in h.run(["redis-cli", "-p", str(SENTINEL_PORT),
                                                  "ping"]).stdout, 20, f"sentinel on {name}")
    ask = ["redis-cli", "-p", str(SENTINEL_PORT), "sentinel", "ckquorum", "mymaster"]
    wait_for(lambda: rig.host("prod").run(ask).stdout.startswith("OK 3 usable"), 30,
             "three Sentinels that know each other (SENTINEL CKQUORUM)", interval=0.5)


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
