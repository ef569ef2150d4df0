"""The Celery tasks, for a checkout's ``tasks`` name: they live in ``cleveragents.tasks``.

``skills.invoke`` (``cleveragents.tasks.invoke``) and ``skills.invoke_chunk``
(``cleveragents.tasks.batch``): thin adapters from a wire request to the runtime
and back. The worker app registers them; importing this package registers nothing.
"""
