"""The docker compose deployment, checked without a Docker engine (none runs here).

docker-compose.yml is validated against the Compose Specification schema and read
the way Compose reads it: ``${VARIABLES}`` filled in from .env.example, which must
define every one of them. Its structure is checked for what the deployment promises
(persistent Redis with a user per role and no default user; scalable, health-checked
workers; Flower behind basic auth with no default login), for least privilege (no
env_file: each service gets only the variables it needs, each password reaches only
Redis and the service of its role, and no password is on any command line), and for
the workers' hardening (no capabilities, no-new-privileges, read-only root with tmpfs
scratch space, memory and process limits). The commands the services run are checked
in test_compose_commands.py, each Redis user's rights in test_redis_acl.py, the
Dockerfile in test_dockerfile.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleveragents.constants import QUEUE_BATCH, QUEUE_READ
from cleveragents.settings import Settings
from tests.support.composefile import (
    ACL_FILE_TARGET,
    BIN,
    COMPOSE_FILE,
    DEFAULT_SERVICES,
    DOCKERFILE,
    ENV_EXAMPLE,
    PLACEHOLDER,
    REDIS_ADMIN,
    REDIS_PEOPLE,
    REDIS_USERS,
    REQUIRED,
    SECRETS,
    SERVICE_ENVIRONMENT,
    WORKER_SETTINGS,
    MissingVariableError,
    _app_services,
    _argv,
    _compose,
    _container_env,
    _interpolate,
    _raw_compose,
    _read_env_file,
    _redis_users_config,
    _services,
    _user_env,
)

# ---- the Compose Specification -------------------------------------------------------------


def test_compose_file_matches_the_compose_specification_schema() -> None:
    # check-jsonschema ships the Compose Specification schema: this needs no network.
    checker = BIN / "check-jsonschema"
    assert checker.exists(), "check-jsonschema is missing: install the dev extra"
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_file_has_no_obsolete_version_key() -> None:
    assert "version" not in _raw_compose()


def test_compose_file_interpolates_without_errors() -> None:
    # Every $ is a valid interpolation or an escaped $$ (a ValueError otherwise).
    assert _compose()["services"]


def test_default_services_and_profiles() -> None:
    services = _services()
    assert set(services) >= DEFAULT_SERVICES
    unprofiled = {name for name, spec in services.items() if not spec.get("profiles")}
    assert unprofiled == DEFAULT_SERVICES
    assert services["worker-readonly"]["profiles"] == ["readonly"]
    assert services["producer"]["profiles"] == ["producer"]
    # RabbitMQ as broker: docker-compose.rabbitmq.yml too (tests/deploy/test_compose_rabbitmq.py)
    assert services["rabbitmq"]["profiles"] == ["rabbitmq"]


# ---- .env.example --------------------------------------------------------------------------


def test_env_example_is_plain_key_value_lines() -> None:
    # Compose reads .env to fill in the ${VARIABLES}: keep to what every dotenv parser agrees on.
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), line
        assert not value.startswith(("'", '"')), f"no quotes, please: {line}"
        assert " #" not in value, f"comments go on lines of their own: {line}"


def test_every_variable_of_the_compose_file_is_in_env_example() -> None:
    used: set[str] = set()
    _interpolate(_raw_compose(), _user_env(), used)
    assert used, "the compose file uses no variables?"
    assert used <= set(_read_env_file(ENV_EXAMPLE)), sorted(used - set(_read_env_file(ENV_EXAMPLE)))


def test_env_example_documents_the_settings_of_the_deployment() -> None:
    defined = set(_read_env_file(ENV_EXAMPLE))
    assert {
        *REQUIRED,
        "WORKER_CONCURRENCY",
        "WORKER_MEM_LIMIT",
        "WORKER_PIDS_LIMIT",
        "CLEVERAGENTS_DEFAULT_TIMEOUT_S",
        "CLEVERAGENTS_VISIBILITY_TIMEOUT_S",
        "CLEVERAGENTS_RESULT_EXPIRES_S",
        "CLEVERAGENTS_LOG_FORMAT",
    } <= defined


def test_compose_refuses_to_start_until_the_passwords_and_flowers_user_are_set() -> None:
    # Flower's user name too: no default login name for anyone to guess.
    assert "FLOWER_USER" in REQUIRED
    example = _read_env_file(ENV_EXAMPLE)
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    for name in REQUIRED:
        # Not prefilled in the example, and required (${VAR:?...}) wherever it is used.
        assert example[name] == "", f"{name} must be empty in .env.example"
        uses = re.findall(rf"\$\{{{name}(\W*)", text)
        assert uses, f"{name} is not used"
        assert all(op.startswith(":?") for op in uses), f"{name} must be ${{{name}:?...}}"
        with pytest.raises(MissingVariableError, match=name):
            _interpolate(_raw_compose(), {**_user_env(), name: ""})


def test_env_example_values_are_valid_settings_for_every_service() -> None:
    for name, spec in _app_services().items():
        settings = Settings.from_env(_container_env(spec))
        user, _ = REDIS_USERS[name]
        assert settings.broker_url == f"redis://{user}:{PLACEHOLDER}@redis:6379/0", name
        assert not settings.embedded
        # An unacknowledged invocation must not be handed to a second worker while the
        # first one still runs it (docs/configuration.md).
        assert settings.visibility_timeout_s > settings.default_timeout_s, name


def test_workers_get_the_settings_of_env_example_and_the_same_defaults_without_them() -> None:
    # Without env_file, a setting of .env reaches a worker only through its `environment`:
    # each one must be passed on, and its ${VAR:-default} must be .env.example's value, so
    # that an .env without the line behaves the same.
    example = _user_env()
    assert set(WORKER_SETTINGS) == {
        key
        for key in example
        if key.startswith(("CLEVERAGENTS_", "OTEL_")) and key != "CLEVERAGENTS_IMAGE"
    }, "a CLEVERAGENTS_* or OTEL_* setting of .env.example that no worker gets"
    without = {key: value for key, value in example.items() if key not in WORKER_SETTINGS}
    for name in ("worker", "worker-readonly"):
        given = _container_env(_services()[name])
        defaults = _container_env(_compose(without)["services"][name])
        for key in WORKER_SETTINGS:
            assert given[key] == example[key], f"{name}: {key}"
            assert defaults[key] == example[key], f"{name}: the default of {key}"
        settings = Settings.from_env(given)
        assert settings.default_timeout_s == float(example["CLEVERAGENTS_DEFAULT_TIMEOUT_S"])
        assert settings.visibility_timeout_s == float(example["CLEVERAGENTS_VISIBILITY_TIMEOUT_S"])
        assert settings.result_expires_s == float(example["CLEVERAGENTS_RESULT_EXPIRES_S"])
        assert settings.log_format == example["CLEVERAGENTS_LOG_FORMAT"]


# ---- least privilege: who gets which secret --------------------------------------------------


def _holding(node: Any, needle: str, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths below ``node`` whose string value contains ``needle``."""
    if isinstance(node, str):
        return [path] if needle in node else []
    if isinstance(node, list):
        return [
            hit for i, item in enumerate(node) for hit in _holding(item, needle, (*path, str(i)))
        ]
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in _holding(v, needle, (*path, str(k)))]
    return []


def test_no_service_reads_all_of_env() -> None:
    for name, spec in _raw_compose()["services"].items():
        assert "env_file" not in spec, f"{name}: env_file hands every secret of .env over"


def test_each_app_service_gets_only_the_variables_it_needs() -> None:
    apps = _app_services()
    assert set(apps) == set(SERVICE_ENVIRONMENT)
    for name, spec in apps.items():
        assert set(_container_env(spec)) == SERVICE_ENVIRONMENT[name], name


def test_each_password_reaches_only_the_services_that_need_it() -> None:
    # Distinct values, so that every place each password lands can be told apart.
    passwords = {name: f"secret{i:02d}value" for i, name in enumerate(SECRETS)}
    tree = _compose({**_user_env(), **passwords})
    services = tree["services"]
    redis_users = _redis_users_config(tree)
    for name, password in passwords.items():
        # Outside the services only the x- fields (ignored by Compose) and Redis' user
        # file (the redis-users config, mounted into Redis only) may hold one.
        rest = {
            key: value
            for key, value in tree.items()
            if key not in ("services", "configs") and not key.startswith("x-")
        }
        assert not _holding(rest, password), name
        in_config = [("redis-users", "content")] if name != "FLOWER_PASSWORD" else []
        assert _holding(tree["configs"], password) == in_config, name
        hits = {
            (service, *path)
            for service, spec in services.items()
            for path in _holding(spec, password)
        }
        if name == "FLOWER_PASSWORD":
            # Flower's environment only (not its command line), and not Redis' users.
            assert hits == {("flower", "environment", "FLOWER_BASIC_AUTH")}
            assert password not in redis_users
        elif name == REDIS_ADMIN[1]:
            # The admin password: Redis' users, and redis-cli's in the Redis container.
            assert hits == {("redis", "environment", "REDISCLI_AUTH")}
            assert f"user {REDIS_ADMIN[0]} reset on >{password} " in redis_users
        elif name in REDIS_PEOPLE.values():
            # A person's role (the approver): Redis' users only, no service's.
            assert hits == set(), name
            [user] = [user for user, var in REDIS_PEOPLE.items() if var == name]
            assert f"user {user} reset on >{password} " in redis_users
        else:
            # A role's password: its user in Redis, and the broker URL of its one service.
            [service] = [svc for svc, (_, var) in REDIS_USERS.items() if var == name]
            user, _ = REDIS_USERS[service]
            assert hits == {(service, "environment", "CLEVERAGENTS_BROKER_URL")}, name
            url = services[service]["environment"]["CLEVERAGENTS_BROKER_URL"]
            assert url == f"redis://{user}:{password}@redis:6379/0"
            assert f"user {user} reset on >{password} " in redis_users


def test_no_password_is_on_any_command_line() -> None:
    # A command line shows in the process list and in `docker inspect`; the environment
    # of a process is readable by its own user only. Redis too reads its users' passwords
    # from a file (the redis-users config), not from --requirepass.
    for name, spec in _services().items():
        for part in ("command", "healthcheck", "entrypoint"):
            assert not _holding(spec.get(part), PLACEHOLDER), f"{name}: a password in its {part}"
        assert "--requirepass" not in _argv(spec.get("command", [])), name


# ---- the services --------------------------------------------------------------------------


def _published_hosts(spec: Mapping[str, Any]) -> list[str]:
    hosts = []
    for port in spec.get("ports", []):
        if isinstance(port, dict):
            hosts.append(str(port.get("host_ip", "")))
        else:
            parts = str(port).rsplit(":", 2)
            hosts.append(parts[0] if len(parts) == 3 else "")
    return hosts


def test_published_ports_listen_on_localhost_only() -> None:
    for name, spec in _services().items():
        for host in _published_hosts(spec):
            assert host == "127.0.0.1", f"{name} publishes a port on {host or 'every interface'}"


def test_redis_persists_loads_its_users_from_the_config_and_has_a_healthcheck() -> None:
    redis = _services()["redis"]
    argv = _argv(redis["command"])
    assert argv[0] == "redis-server"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"
    assert argv[argv.index("--aclfile") + 1] == ACL_FILE_TARGET
    assert redis["configs"] == [{"source": "redis-users", "target": ACL_FILE_TARGET}]
    assert any(str(volume).endswith(":/data") for volume in redis["volumes"])
    assert not redis.get("ports"), "Redis is for this project's containers only"
    # The health check logs in as the admin user, with the password from REDISCLI_AUTH.
    test = " ".join(redis["healthcheck"]["test"])
    assert f"redis-cli --user {REDIS_ADMIN[0]} ping" in test
    assert _container_env(redis)["REDISCLI_AUTH"] == PLACEHOLDER


def test_redis_users_are_one_per_role_each_with_its_own_password_and_no_default() -> None:
    lines = _redis_users_config(_raw_compose()).splitlines()
    users = {line.split()[1]: line for line in lines}
    assert len(users) == len(lines), "each user is defined once"
    assert [line.split()[0] for line in lines] == ["user"] * len(lines)
    # Nobody gets in without a user name: the default user is off, with no rights.
    assert users.pop("default") == "user default reset off"
    admin, admin_password = REDIS_ADMIN
    assert (
        users.pop(admin)
        == f"user {admin} reset on >${{{admin_password}:?set {admin_password} in .env}} ~* &* +@all"
    )
    assert set(users) == {user for user, _ in REDIS_USERS.values()} | set(REDIS_PEOPLE)
    for user, variable in [*REDIS_USERS.values(), *REDIS_PEOPLE.items()]:
        rules = users[user].split()
        assert rules[:4] == ["user", user, "reset", "on"], user
        assert rules[4] == f">${{{variable}:?set", user
        # Every role starts from nothing, and gets no key or channel outside its selectors.
        assert rules[rules.index("-@all") :][:3] == ["-@all", "+@connection", "-@dangerous"]
        for everything in ("+@all", "~*", "&*", "allkeys", "allchannels", "allcommands"):
            assert everything not in rules, user


def test_project_services_share_one_image_built_from_this_repository() -> None:
    apps = _app_services()
    assert set(apps) == {"worker", "worker-readonly", "flower", "metrics", "producer"}
    assert {json.dumps(spec["build"]) for spec in apps.values()} == {json.dumps(".")}
    assert len({spec["image"] for spec in apps.values()}) == 1


def test_worker_waits_for_redis_scales_and_checks_its_health() -> None:
    for name in ("worker", "worker-readonly"):
        worker = _services()[name]
        assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
        # --scale worker=N needs no fixed name and no host port.
        assert "container_name" not in worker
        assert not worker.get("ports")
        test = " ".join(worker["healthcheck"]["test"])
        # $$HOSTNAME in the file: the container's shell fills in its own hostname.
        assert "inspect ping" in test
        assert "celery@$HOSTNAME" in test


def test_worker_writes_and_the_readonly_worker_only_reads() -> None:
    services = _services()
    assert _container_env(services["worker"])["CLEVERAGENTS_READ_ONLY"] == "0"
    assert _container_env(services["worker-readonly"])["CLEVERAGENTS_READ_ONLY"] == "1"
    argv = _argv(services["worker-readonly"]["command"])
    assert set(argv[argv.index("-Q") + 1].split(",")) == {QUEUE_READ, QUEUE_BATCH}
    worker = _argv(services["worker"]["command"])
    assert worker[worker.index("--concurrency") + 1] == _user_env()["WORKER_CONCURRENCY"]


def test_flower_has_basic_auth_persistent_state_and_a_healthcheck() -> None:
    flower = _services()["flower"]
    argv = _argv(flower["command"])
    options = dict(arg.partition("=")[::2] for arg in argv if arg.startswith("--"))
    # The login is in Flower's environment (FLOWER_BASIC_AUTH), not on its command line.
    assert "--basic-auth" not in options
    assert "--basic_auth" not in options
    login = _container_env(flower)["FLOWER_BASIC_AUTH"]
    assert login == f"{_user_env()['FLOWER_USER']}:{PLACEHOLDER}"
    assert "," not in login, "Flower splits FLOWER_BASIC_AUTH on commas"
    assert options["--persistent"] == "True"
    assert int(options["--state_save_interval"]) > 0
    # The state file lies on a volume, so it outlives the container.
    mounts = [str(volume).split(":")[1] for volume in flower["volumes"]]
    assert any(Path(options["--db"]).parent == Path(mount) for mount in mounts)
    assert flower["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"])


@pytest.mark.parametrize("service", ["flower", "metrics"])
def test_http_services_check_the_port_they_serve_and_publish(service: str) -> None:
    spec = _services()[service]
    argv = _argv(spec["command"])
    option = next(arg for arg in argv if arg.startswith("--port"))
    port = option.split("=", 1)[1] if "=" in option else argv[argv.index(option) + 1]
    assert [str(p).rsplit(":", 1)[1] for p in spec["ports"]] == [port]
    assert f"localhost:{port}/" in " ".join(spec["healthcheck"]["test"])


# ---- hardening -----------------------------------------------------------------------------

WORKERS = ("worker", "worker-readonly")


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _bytes(size: str) -> int:
    """A Docker size (``256m``, ``1g``, ``512k`` or bytes) in bytes."""
    match = re.fullmatch(r"(\d+)([bkmg]?)", size.lower())
    assert match, f"not a size: {size}"
    return int(match[1]) * _UNITS[match[2]]


def _tmpfs(spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """A service's tmpfs mounts: path -> mount options."""
    entries = spec.get("tmpfs", [])
    mounts = {}
    for entry in [entries] if isinstance(entries, str) else entries:
        path, _, options = str(entry).partition(":")
        mounts[path] = dict(option.partition("=")[::2] for option in options.split(",") if option)
    return mounts


def test_app_services_keep_no_capability_and_cannot_gain_privileges() -> None:
    # They run as uid 10001 (the Dockerfile) and bind no port below 1024.
    for name, spec in _app_services().items():
        assert spec["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in spec["security_opt"], name
        assert not spec.get("cap_add"), name
        assert not spec.get("privileged"), name


def test_workers_run_on_a_read_only_root_with_tmpfs_scratch_space() -> None:
    for name in WORKERS:
        spec = _services()[name]
        assert spec["read_only"] is True, name
        mounts = _tmpfs(spec)
        # Command tools' temporary directories (TMPDIR is not set: /tmp), and the working
        # directory's .cleveragents, where the example note tools write.
        assert set(mounts) == {"/tmp", "/app/.cleveragents"}, name
        assert "TMPDIR" not in _container_env(spec), name
        for path, options in mounts.items():
            assert _bytes(options["size"]) > 0, (name, path)
            # World-writable with the sticky bit: uid 10001 writes there, as in any /tmp.
            assert options["mode"] == "1777", (name, path)
        # Nothing else is writable: a volume of theirs is read-only.
        for volume in spec.get("volumes", []):
            assert str(volume).endswith(":ro"), (name, volume)


def test_workers_have_memory_and_process_limits_with_env_examples_defaults() -> None:
    example = _user_env()
    limits = ("WORKER_MEM_LIMIT", "WORKER_PIDS_LIMIT")
    without = _compose({key: value for key, value in example.items() if key not in limits})
    for name in WORKERS:
        spec, default = _services()[name], without["services"][name]
        assert str(spec["mem_limit"]) == example["WORKER_MEM_LIMIT"] == str(default["mem_limit"])
        pids = int(spec["pids_limit"])
        assert pids == int(example["WORKER_PIDS_LIMIT"]) == int(default["pids_limit"]), name
        # Enough for the pool, its threads and a tool's processes; not unlimited (-1).
        assert pids >= 64, name
        # The tmpfs scratch space counts against the memory limit: it must leave room.
        scratch = sum(_bytes(options["size"]) for options in _tmpfs(spec).values())
        assert scratch <= _bytes(str(spec["mem_limit"])) // 2, name


# ---- your own skills: a mounted folder, or an image of your own (docs/deployment.md) ----------

DEPLOYMENT_DOC = COMPOSE_FILE.parent / "docs" / "deployment.md"
#: Where both ways put the skill folders: the folder a worker serves when it exists.
SKILLS_IN_IMAGE = "/app/skills"


def _own_skills_blocks(lang: str) -> dict[str, str]:
    """The ``lang`` blocks of "Your own skills", by their first line (a comment naming them)."""
    section = DEPLOYMENT_DOC.read_text(encoding="utf-8").split("\n## Your own skills\n")[1]
    section = section.split("\n## ")[0]
    blocks = re.findall(rf"^```{lang}\n(.*?)^```$", section, flags=re.M | re.S)
    return {block.splitlines()[0]: block for block in blocks}


def _override(way: str) -> dict[str, Any]:
    [block] = [b for first, b in _own_skills_blocks("yaml").items() if way in first]
    loaded = yaml.safe_load(block)
    assert isinstance(loaded, dict)
    return loaded


def test_the_documented_skills_overrides_are_valid_compose_files(tmp_path: Path) -> None:
    blocks = _own_skills_blocks("yaml")
    assert len(blocks) == 2, list(blocks)
    for first, block in blocks.items():
        assert first.startswith("# docker-compose.override.yml: "), first
        path = tmp_path / "docker-compose.override.yml"
        path.write_text(block, encoding="utf-8")
        done = subprocess.run(
            [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, first + "\n" + done.stdout + done.stderr


def test_a_mounted_skills_folder_is_the_folder_the_workers_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = _override("mounted")["services"]
    assert set(services) == set(WORKERS)
    for name in WORKERS:
        assert services[name]["volumes"] == [f"./skills:{SKILLS_IN_IMAGE}:ro"], name
        # No CLEVERAGENTS_CATALOGUE: the worker serves ./skills of its working directory.
        assert "CLEVERAGENTS_CATALOGUE" not in _container_env(_services()[name]), name
    workdir = [
        line.split()[1]
        for line in DOCKERFILE.read_text().splitlines()
        if line.startswith("WORKDIR ")
    ][-1]
    assert f"{workdir}/skills" == SKILLS_IN_IMAGE
    (tmp_path / "skills").mkdir()
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({}).catalogue_paths == (str(tmp_path / "skills"),)


def test_an_image_of_your_own_is_built_from_this_projects_image_and_after_it() -> None:
    [dockerfile] = [b for first, b in _own_skills_blocks("dockerfile").items()]
    name = dockerfile.splitlines()[0].removeprefix("# ").split(":")[0]
    instructions = [
        line.split(maxsplit=1)
        for line in dockerfile.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [keyword for keyword, _ in instructions] == ["FROM", "COPY"]
    base = instructions[0][1]
    assert instructions[1][1].split() == ["skills/", f"{SKILLS_IN_IMAGE}/"]
    services = _override("image plus")["services"]
    assert set(services) == set(WORKERS)
    projects = _services()
    for worker in WORKERS:
        build = services[worker]["build"]
        assert build["dockerfile"] == name
        # Its FROM is a service's image, which Compose then builds first: this project's,
        # of a service that always runs, tagged as the FROM line says.
        [(context, source)] = build["additional_contexts"].items()
        assert context == base
        service = source.removeprefix("service:")
        assert service in DEFAULT_SERVICES - set(WORKERS)
        assert projects[service]["build"] == "."
        assert _raw_compose()["services"][service]["image"].endswith(f":-{base}}}")
        # A tag of its own: the workers' build must not overwrite the other services' image.
        assert services[worker]["image"] != base
