"""Everything that touches Celery's or kombu's internals, in one package.

The Celery settings (``celery_settings``), message signing, RabbitMQ's queues,
the queue search and the waiting count, the Redis transport, fetch, liveness and
result backend (``redis/``), and the patches applied when a worker starts
(``patches/``). Each private member used here is listed, with the versions it was
written for, in ``internals`` (docs/architecture.md).
"""

__all__: list[str] = []
