"""Names and limits shared by producers, workers and the CLI: one place, one comment each."""

from __future__ import annotations

#: The Celery task that runs one invocation (SPEC section 5).
TASK_INVOKE = "skills.invoke"
#: The Celery task that runs a chunk of batch invocations, one stored result each.
TASK_INVOKE_CHUNK = "skills.invoke_chunk"

#: Interactive invocations that may not write: every worker consumes it.
QUEUE_READ = "skills.read"
#: Invocations that allow writes: only workers trusted to write consume it.
QUEUE_WRITE = "skills.write"
#: Chunks of batch invocations, kept apart so a batch never starves interactive work.
QUEUE_BATCH = "skills.batch"
#: Batch chunks that allow writes.
QUEUE_BATCH_WRITE = "skills.batch.write"
#: RabbitMQ only: where a skill queue puts a message past ``DELIVERY_LIMIT``; nobody
#: consumes it (docs/guarantees.md, "Poison messages end").
QUEUE_DEAD = "skills.dead"
#: RabbitMQ only: returns (redeliveries) of one message before its quorum queue
#: dead-letters it. A backstop above the guard's own limit (``guard.MAX_ATTEMPTS``, 3):
#: the guard ends a poison invocation after 3 returns, a chunk holding three of them
#: after 9; only a message that never reaches the guard (it ends its worker before
#: the task runs) or comes back more often than that gets here.
DELIVERY_LIMIT = 10

#: Prefix of the keys where batch bookkeeping lives in the result backend's Redis.
BATCH_KEY_PREFIX = "cleveragents:batch:"
#: Prefix of the at-most-once markers of write-capable, non-idempotent invocations.
CLAIM_KEY_PREFIX = "cleveragents:claim:"
#: Prefix of the keys that bind a request id to a digest of its content
#: (``cleveragents.pipeline.binding``).
BIND_KEY_PREFIX = "cleveragents:bind:"
#: Prefix of a background batch's seal: how many ids it has and their digest, made once
#: by its producer at submit (``cleveragents.batch.seal``).
SEAL_KEY_PREFIX = "cleveragents:seal:"
#: Prefix of a tool's fleet-wide limits: its running slots and its window of starts
#: (``cleveragents.pipeline.quotas``).
LIMIT_KEY_PREFIX = "cleveragents:limit:"
#: Prefix of an invocation's cancel mark: a worker that finds it never starts the run.
CANCEL_KEY_PREFIX = "cleveragents:cancel:"
#: The Redis list of poison invocations kept for inspection (newest first).
DEAD_LETTER_KEY = f"{CLAIM_KEY_PREFIX}dead-letter"
#: Celery's state of an invocation parked until a person decides (``cleveragents result``).
STATE_AWAITING_APPROVAL = "AWAITING_APPROVAL"
#: A parked invocation's record (a hash), written by workers (docs/approvals.md).
APPROVAL_KEY_PREFIX = "cleveragents:approval:"
#: A person's decision about one (a hash), written only by an approver.
DECISION_KEY_PREFIX = "cleveragents:decision:"
#: The invocations that wait for a decision, by the time they were parked (a sorted set).
APPROVAL_INDEX_KEY = "cleveragents:approvals"
#: The audit trail of writes (a stream), written by workers, capped at CLEVERAGENTS_AUDIT_MAXLEN.
AUDIT_KEY = "cleveragents:audit"
#: A read-only worker's parked records, their index and its audit trail: keys of its own,
#: so that its Redis user can neither plant nor rewrite what write workers act on
#: (docs/security.md, "Who may write what a worker acts on").
READ_ONLY_APPROVAL_KEY_PREFIX = "cleveragents:ro:approval:"
READ_ONLY_APPROVAL_INDEX_KEY = "cleveragents:ro:approvals"
READ_ONLY_AUDIT_KEY = "cleveragents:ro:audit"
#: Prefix of a read-only worker's fleet-wide limits (write workers' under ``LIMIT_KEY_PREFIX``).
READ_ONLY_LIMIT_KEY_PREFIX = "cleveragents:ro:limit:"
#: Dead letters kept; older ones are dropped.
DEAD_LETTER_LIMIT = 10_000
#: Redis hash of finished invocations by skill, tool, outcome and error type.
INVOCATIONS_KEY = "cleveragents:metrics:invocations"
#: Redis hash of invocation durations: histogram buckets and ``sum:`` totals.
DURATIONS_KEY = "cleveragents:metrics:durations"
#: Redis hash of the messages workers hold: delivery tag -> holder
#: (``cleveragents.broker.redis.liveness``).
HELD_KEY = "cleveragents:held"
#: Prefix of a holder's heartbeat key; the key expires when the holder stops beating.
ALIVE_KEY_PREFIX = "cleveragents:alive:"
#: The Redis lock one worker takes to give back what dead holders held.
REAPER_KEY = "cleveragents:reaper"
#: Where read-only workers keep what they hold instead (their own ``unacked`` hash,
#: index and mutex, held hash and reaper lock under it; their holders' heartbeat keys
#: under ``ALIVE_KEY_PREFIX + "ro/"``), so that their Redis user can neither read nor
#: hold what write workers hold (``RecoveryKeys``).
READ_ONLY_RECOVERY_PREFIX = "cleveragents:ro:"
#: Prefix of a queue's doorbell, rung as a message is published
#: (``cleveragents.broker.redis.fetch``).
DOOR_KEY_PREFIX = "cleveragents:door:"

#: Largest arguments accepted, in bytes of their JSON.
MAX_REQUEST_BYTES = 1_000_000
#: Deepest arguments and tool output accepted, in objects and arrays counted from the
#: outermost: deeper, a structure breaks the encoders on its way (JSON and kombu at a depth
#: that depends on the call stack, pydantic's at about 250), and a result could not be
#: stored. serde_json's default limit is the same.
MAX_NESTING_DEPTH = 128
#: Largest message a worker decodes; bigger ones get a validation_error undecoded.
MAX_MESSAGE_BYTES = 16_000_000
#: A batch chunk is sent before its arguments reach this many bytes of JSON.
MAX_CHUNK_BYTES = 4_000_000
#: The most requests one chunk message runs (``batch run --chunk-size``'s maximum): a
#: worker sends the items past it back unrun, in messages of this many, before it runs.
MAX_CHUNK_ITEMS = 10_000
#: Largest stderr tail kept in a command tool's failure details, in characters (redacted).
STDERR_TAIL_CHARS = 1_000
#: Largest stdout head kept when a command tool's stdout is not JSON, in characters (redacted).
STDOUT_HEAD_CHARS = 100
#: Seconds a task may run past its invocation's timeout before Celery's hard time
#: limit ends its pool process (the backstop for a tool that cannot be stopped).
HARD_LIMIT_GRACE_S = 5.0
#: Longest one wait for a limit (``cleveragents/tasks/resend.py``): the message comes back
#: and asks again (a broker such as RabbitMQ ends a consumer that holds a message past
#: its timeout, 30 min by default).
MAX_LIMIT_WAIT_S = 60.0
#: Seconds before a delivery sent back to wait for its write's first run, which may
#: still go on elsewhere, asks again (``cleveragents/pipeline/guard.py``).
FIRST_RUN_POLL_S = 1.0
#: Message header with the time (epoch seconds) a producer sent an invocation.
SENT_AT_HEADER = "cleveragents_sent_at"
#: Message header of a batch chunk: its batch id and item numbers (``wire.ChunkContext``).
BATCH_HEADER = "cleveragents_batch"
#: Placeholder shown instead of arguments in Flower and logs.
REDACTED = "[redacted]"

#: The largest skill file read (bytes): a larger one is a problem of its file, unread.
MAX_SKILL_FILE_BYTES = 1_000_000
#: A skill file's YAML aliases may expand it to at most this many times its own size
#: (plus ``ALIAS_EXPANSION_FLOOR`` bytes): past that it is an alias bomb, refused.
ALIAS_EXPANSION_FACTOR = 10
ALIAS_EXPANSION_FLOOR = 10_000
