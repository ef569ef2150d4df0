"""Catalogue benchmark: load and resolve 1,000 skills, then the per-job cost of a lookup.

Run it with ``.venv/bin/python benchmarks/catalogue_bench.py``. It writes a
catalogue of 1,000 YAML skill files (5 layers of 200 skills, 3 tools each; every
skill of layers 1-4 includes 1-3 skills of the next layer, so includes go 5
deep and diamonds abound) into a temporary folder, then measures:

* ``Catalogue.from_paths``: read every file and resolve every skill, once;
* per job, what a worker does with a loaded catalogue: ``catalogue.resolve(name)``
  and ``catalogue.find_tool(skill, tool)`` (cached: a dict lookup each);
* for comparison, an uncached ``resolve_skill(name, skills)`` per job.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import yaml

from cleveragents.skills import Catalogue, Skill, resolve_skill

LAYERS = 5
PER_LAYER = 200
TOOLS_PER_SKILL = 3


def skill_name(layer: int, index: int) -> str:
    return f"bench/l{layer}-s{index:03d}"


def build_skill_dicts(seed: int) -> list[dict[str, Any]]:
    """Every skill as the mapping written to its YAML file."""
    rng = random.Random(seed)
    skills: list[dict[str, Any]] = []
    for layer in range(LAYERS):
        for index in range(PER_LAYER):
            name = skill_name(layer, index)
            includes = (
                [skill_name(layer + 1, i) for i in rng.sample(range(PER_LAYER), rng.randint(1, 3))]
                if layer + 1 < LAYERS
                else []
            )
            tools = [
                {
                    "name": f"{name}-t{t}",
                    "description": f"tool {t} of {name}",
                    "source": "python",
                    "entrypoint": "cleveragents.examples.tools:echo",
                    "writes": t == 2 and index % 10 == 0,
                    "input_schema": {
                        "type": "object",
                        "properties": {"text": {"type": "string"}},
                        "required": ["text"],
                    },
                }
                for t in range(TOOLS_PER_SKILL)
            ]
            skills.append(
                {
                    "name": name,
                    "description": f"benchmark skill {layer}/{index}",
                    "version": "1.0.0",
                    "includes": includes,
                    "tools": tools,
                }
            )
    return skills


def write_catalogue(folder: Path, skills: list[dict[str, Any]]) -> None:
    for data in skills:
        layer, rest = data["name"].split("/", 1)[1].split("-", 1)
        path = folder / layer / f"{rest}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def per_call_us(func: Any, calls: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` average time of one call, in microseconds."""
    timer = timeit.Timer(func)
    return min(timer.repeat(repeat=repeats, number=calls)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loads", type=int, default=3, help="timed from_paths runs")
    args = parser.parse_args()

    skill_dicts = build_skill_dicts(args.seed)
    skills = {d["name"]: Skill.model_validate(d) for d in skill_dicts}

    with tempfile.TemporaryDirectory(prefix="cleveragents-bench-") as tmp:
        folder = Path(tmp)
        write_catalogue(folder, skill_dicts)
        files = sum(1 for _ in folder.rglob("*.yaml"))

        load_times = []
        catalogue = None
        for _ in range(args.loads):
            started = time.perf_counter()
            catalogue = Catalogue.from_paths(folder)
            load_times.append(time.perf_counter() - started)
        assert catalogue is not None

    if catalogue.errors:
        raise SystemExit(f"benchmark catalogue has errors: {catalogue.errors[:3]}")

    started = time.perf_counter()
    Catalogue.from_skills(skills.values())
    resolve_all_s = time.perf_counter() - started

    top = [skill_name(0, i) for i in range(PER_LAYER)]
    tool_counts = [catalogue.resolve(n).metadata.tool_count for n in top]
    # A job on a top-layer skill, calling a tool that sits deep in its includes.
    job_skill = max(top, key=lambda n: catalogue.resolve(n).metadata.tool_count)
    job_tool = catalogue.resolve(job_skill).resolved_tools[-1].tool.name

    cached_resolve_us = per_call_us(lambda: catalogue.resolve(job_skill), calls=200_000)
    find_tool_us = per_call_us(lambda: catalogue.find_tool(job_skill, job_tool), calls=200_000)
    uncached_us = per_call_us(lambda: resolve_skill(job_skill, skills), calls=20, repeats=3)
    started = time.perf_counter()
    for name in top:
        resolve_skill(name, skills)
    uncached_avg_us = (time.perf_counter() - started) / len(top) * 1e6

    print("CleverAgents catalogue benchmark")
    print(
        f"  catalogue: {files} YAML files, {len(catalogue)} skills, {LAYERS} layers of "
        f"{PER_LAYER}, {TOOLS_PER_SKILL} tools each, includes 5 deep (1-3 per skill)"
    )
    print(
        f"  top-layer skills resolve to {min(tool_counts)}-{max(tool_counts)} tools "
        f"(mean {statistics.mean(tool_counts):.0f})"
    )
    print()
    print(
        f"  Catalogue.from_paths (load + resolve all):   {min(load_times) * 1e3:9.1f} ms "
        f"(best of {args.loads}; mean {statistics.mean(load_times) * 1e3:.1f} ms)"
    )
    print(f"  of which resolving all 1,000 parsed skills:  {resolve_all_s * 1e3:9.1f} ms")
    print(
        f"  of which reading + parsing + validating files: "
        f"{(min(load_times) - resolve_all_s) * 1e3:7.1f} ms"
    )
    print()
    print(f"  per job, on {job_skill} ({catalogue.resolve(job_skill).metadata.tool_count} tools):")
    print(f"    catalogue.resolve(name)      (cached):    {cached_resolve_us:9.3f} us")
    print(f"    catalogue.find_tool(s, t)    (cached):    {find_tool_us:9.3f} us")
    print(f"    resolve_skill(name, skills)  (uncached):  {uncached_us:9.1f} us")
    print(f"    resolve_skill, mean over the 200 top skills: {uncached_avg_us:6.1f} us")
    print()
    print(f"  ratio uncached resolve_skill / cached find_tool: {uncached_us / find_tool_us:,.0f}x")
    print(
        f"  ratio uncached resolve_skill / cached resolve:   "
        f"{uncached_us / cached_resolve_us:,.0f}x"
    )


if __name__ == "__main__":
    main()
