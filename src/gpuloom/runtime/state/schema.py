"""The store's tables (SQLAlchemy Core): jobs and their events and allocation records, profiles, tokens,
idempotency keys, audit, reservations, meta, the server epoch, GPU telemetry and series; and the columns
added since the first release (created on stores that predate them)."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

jobs_t = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("user", String(100), nullable=False, index=True),
    Column("spec", Text, nullable=False),
    Column("state", String(40), nullable=False, index=True),
    Column("submit_time", Float, nullable=False),
    Column("first_start", Float),
    Column("last_start", Float),
    Column("end_time", Float),
    Column("alloc", Text),  # JSON: current allocation, null when holding nothing
    Column("procs", Text),  # JSON: launched processes (node, pid, start_time, cores)
    Column("attempts", Integer, nullable=False, default=0),  # launches so far
    Column("resume_count", Integer, nullable=False, default=0),  # launches with GPULOOM_RESUME=1
    Column("preemptions", Integer, nullable=False, default=0),
    Column("checkpoint_dir", Text),
    Column("progress", Float),  # iterations done by its last progress line when it last stopped
    Column("held_time", Float, nullable=False, default=0.0),  # seconds held before the current run (service time)
    Column("held_gpu_time", Float, nullable=False, default=0.0),
    Column("exit_code", Integer),
    Column("reason", Text),  # why it ended / waits / was refused
    Column("cancel_requested", Boolean, nullable=False, default=False),
    # the job's remaining work (reference seconds) exactly as of ``work_at`` (service time): a
    # restarted service continues from it at the model's speed instead of guessing from held time
    Column("work_left", Float),
    Column("work_at", Float),
    Column("pending_reason", String(200)),  # why a queued job waits, as of the last round (Slurm's REASON)
    Column("array_id", Integer),  # job arrays: the first task's id, and this task's index
    Column("array_task", Integer),
    # service time of the last launch (``last_start`` is its wall time, for people): held time counts
    # from it, across restarts too, whatever the wall clock did meanwhile
    Column("last_start_at", Float),
)
#: a dependency on an array reads its tasks' counts by state (and whether they started) from this index
#: alone, without the rows (a 10,000-task array: ~1.5 ms instead of ~25 ms)
Index("ix_jobs_array_state", jobs_t.c.array_id, jobs_t.c.state, jobs_t.c.first_start)

#: columns added after the first release: created on stores that predate them
_ADDED_COLUMNS = {"jobs": (("work_left", "FLOAT"), ("work_at", "FLOAT"), ("pending_reason", "VARCHAR(200)"),
                           ("array_id", "INTEGER"), ("array_task", "INTEGER"), ("last_start_at", "FLOAT")),
                  "tokens": (("expires", "FLOAT"),)}

events_t = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, index=True),
    Column("time", Float, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("detail", Text),
)

#: what each job held over time: one row per allocation (a launch, a regroup, an adoption keeps it);
#: kept by :meth:`Store.update_job` whenever a job's ``alloc`` changes, in the same transaction
allocations_t = Table(
    "allocations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, nullable=False, index=True),
    Column("start_time", Float, nullable=False),  # wall seconds
    Column("end_time", Float),  # null while held
    Column("gpus", Integer, nullable=False),
    Column("nodes", Text, nullable=False),  # comma-separated node names
    Column("alloc", Text, nullable=False),  # JSON, as in jobs.alloc
    Column("opened_by", String(40)),  # the event that took it (launch, resume, move, resize, regroup)
    Column("closed_by", String(40)),  # the event that gave it up (preempt, finished, failed, ...)
)

profiles_t = Table(
    "profiles",
    metadata,
    Column("model", String(200), primary_key=True),
    Column("profile", Text, nullable=False),
    Column("updated", Float, nullable=False),
)

tokens_t = Table(
    "tokens",
    metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("user", String(100), nullable=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("created", Float, nullable=False),
    Column("expires", Float),  # wall time after which the token is refused (null: never)
)

#: a submission's idempotency key -> the job it created (a retried submission gets the same job)
idempotency_t = Table(
    "idempotency",
    metadata,
    Column("user", String(100), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("job_id", Integer, nullable=False),
    Column("created", Float, nullable=False),
)

# Who changed what outside jobs (tokens, queues): written and read by :mod:`.audit`.
audit_t = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False, index=True),  # wall seconds
    Column("actor", String(100), nullable=False, index=True),  # who did it: a user name (the token's)
    Column("kind", String(40), nullable=False, index=True),  # token.create, queue.set, ...
    Column("subject", String(100)),  # the user concerned (a token's owner, a user given a queue)
    Column("target", String(200)),  # what changed: a queue, a group, a token id
    Column("detail", Text),  # JSON
)

# Advance reservations, wall-clock times: written and read by :mod:`.reservations`.
reservations_t = Table(
    "reservations",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("start", Float, nullable=False),  # wall seconds
    Column("end", Float, nullable=False),
    Column("users", Text, nullable=False),  # JSON list
    Column("nodes", Text, nullable=False),  # JSON list (empty: a GPU count)
    Column("gpus", Float, nullable=False),
    Column("created", Float, nullable=False),
    Column("creator", String(100), nullable=False),
)

meta_t = Table(
    "meta",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
#: the server epoch, a fencing token (one row, id 1): raised by each server that takes the database
#: (:meth:`Store.take_epoch`); a server's writes commit only while the stored epoch is still its own
epoch_t = Table(
    "server_epoch",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", Integer, nullable=False),
)
# GPU telemetry totals per job and the dashboard's time series: written and read by :mod:`.gpudb`.
gpu_usage_t = Table(
    "gpu_usage", metadata,
    Column("job_id", Integer, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("util_sum", Float, nullable=False),  # sum over samples of the mean utilisation (%) of its GPUs
    Column("util_max", Float, nullable=False),
    Column("mem_max_mb", Float, nullable=False),  # MiB its GPUs held at once, at most
    Column("energy_j", Float),  # None: some GPU had no power reading
    Column("updated", Float, nullable=False),
)
series_t = Table(
    "series", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("step", Float, nullable=False),  # the interval the point stands for: fine or COARSE_S
    Column("doc", Text, nullable=False),
    Index("ix_series_step_time", "step", "time"),
)
