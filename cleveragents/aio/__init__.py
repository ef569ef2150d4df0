"""The producer for asyncio: ``AsyncSkillClient`` submits invocations and awaits their
results on one event loop (``client.py``); ``results.py`` is where it awaits them."""

from cleveragents.aio.client import AsyncInvocationHandle, AsyncSkillClient

__all__ = ["AsyncInvocationHandle", "AsyncSkillClient"]
