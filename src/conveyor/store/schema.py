"""The schema, as versioned migrations written once for both backends.

Types are spelled with placeholders that each dialect fills in:
``{id}`` an auto-increment primary key, ``{real}`` a float, ``{blob}`` bytes;
``{byte_ordered_keys}`` makes item keys compare byte by byte (PostgreSQL's
``COLLATE "C"``; SQLite compares bytes already), so a root's fan-out
descendants are one index range whatever the database's locale;
``{bytes_order}`` after a column's type makes it compare byte by byte too (for new tables);
``{publication_text_index}`` is the full-text index of the live publications
(an FTS5 table on SQLite, a tsvector column with a GIN index on PostgreSQL).
Timestamps are epoch seconds (float) so the clock can be passed in.
"""

from __future__ import annotations

from conveyor.store.queuecounts import MIGRATION as OPEN_TASK_SECONDS
from conveyor.store.runtotals import RECOUNT

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "engine core: runs, items, tasks, outputs, attempts, dead letters",
        """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    target TEXT NOT NULL,
    input TEXT NOT NULL,
    status TEXT NOT NULL,
    expected INTEGER NOT NULL DEFAULT 0,
    has_publish INTEGER NOT NULL DEFAULT 0,
    stages TEXT NOT NULL,
    created_at {real} NOT NULL,
    submitted_at {real},
    finished_at {real}
);

CREATE TABLE items (
    run_id TEXT NOT NULL,
    item_key TEXT NOT NULL,
    parent_key TEXT,
    root_key TEXT NOT NULL,
    source_digest TEXT,
    source_size INTEGER,
    created_at {real} NOT NULL,
    PRIMARY KEY (run_id, item_key)
);

CREATE TABLE tasks (
    id {id},
    run_id TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    item_key TEXT NOT NULL,
    root_key TEXT NOT NULL,
    status TEXT NOT NULL,
    task_key TEXT NOT NULL,
    stage_version TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    input_digest TEXT NOT NULL,
    input_kind TEXT NOT NULL,
    input_inline {blob},
    input_size INTEGER NOT NULL,
    output_digest TEXT,
    output_kind TEXT,
    cached INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    available_at {real} NOT NULL,
    lease_token INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires_at {real},
    error_class TEXT,
    last_error TEXT,
    created_at {real} NOT NULL,
    started_at {real},
    finished_at {real},
    UNIQUE (run_id, root_key, item_key, stage)
);
-- The hot queue: only runnable and leased rows are indexed.
CREATE INDEX tasks_runnable ON tasks (pipeline, stage, available_at) WHERE status = 'queued' AND crashes = 0;
-- Tasks that were in flight when their worker died run alone, one at a time.
CREATE INDEX tasks_suspect ON tasks (pipeline, available_at) WHERE status = 'queued' AND crashes > 0;
CREATE INDEX tasks_leased ON tasks (pipeline, lease_expires_at) WHERE status = 'running';

CREATE TABLE outputs (
    task_key TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    kind TEXT NOT NULL,
    digest TEXT NOT NULL,
    inline {blob},
    size INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    created_at {real} NOT NULL
){without_rowid};

CREATE TABLE attempts (
    id {id},
    task_id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    invoked INTEGER NOT NULL,
    error_class TEXT,
    message TEXT,
    worker TEXT,
    lease_token INTEGER,
    stage_version TEXT,
    code_version TEXT,
    started_at {real},
    duration {real}
);
CREATE INDEX attempts_run_task ON attempts (run_id, task_id);

CREATE TABLE dead_letters (
    id {id},
    task_id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    item_key TEXT NOT NULL,
    stage TEXT NOT NULL,
    error_class TEXT,
    error TEXT,
    attempts INTEGER NOT NULL,
    created_at {real} NOT NULL,
    replayed_at {real},
    replay_reason TEXT
);
CREATE INDEX dead_letters_run ON dead_letters (run_id, replayed_at);
""",
    ),
    (
        2,
        "model usage per attempt: provider calls, tokens, cost, model and prompt version",
        """
ALTER TABLE attempts ADD COLUMN provider_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN cost {real} NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN model TEXT;
ALTER TABLE attempts ADD COLUMN prompt_version TEXT;
""",
    ),
    (
        3,
        "fleet-wide provider quotas, lanes (interactive before bulk)",
        """
-- One row per provider request granted by the quota ledger (or per interactive demand marker,
-- requests = 0): a sliding window over these rows is the fleet's use of a provider's limits.
CREATE TABLE quota_grants (
    id {id},
    quota_key TEXT NOT NULL,
    lane TEXT NOT NULL,
    granted_at {real} NOT NULL,
    at {real} NOT NULL,
    tokens INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    settled INTEGER NOT NULL DEFAULT 0,
    worker TEXT
);
CREATE INDEX quota_grants_window ON quota_grants (quota_key, at);
-- A 429 with Retry-After stops the whole fleet from calling that key until then.
CREATE TABLE quota_pauses (
    quota_key TEXT PRIMARY KEY,
    paused_until {real} NOT NULL,
    reason TEXT
);
ALTER TABLE runs ADD COLUMN lane TEXT NOT NULL DEFAULT 'bulk';
-- 0 = interactive, 1 = bulk: lower ranks are claimed first.
ALTER TABLE tasks ADD COLUMN lane_rank INTEGER NOT NULL DEFAULT 1;
DROP INDEX tasks_runnable;
CREATE INDEX tasks_runnable ON tasks (pipeline, stage, lane_rank, available_at) WHERE status = 'queued' AND crashes = 0;
""",
    ),
    (
        4,
        "memo indexed by a 64-bit integer key: outputs appended in order, a compact unique index",
        """
CREATE TABLE outputs_v4 (
    id {id},
    key64 BIGINT NOT NULL,
    task_key TEXT NOT NULL,
    stage TEXT NOT NULL,
    kind TEXT NOT NULL,
    digest TEXT NOT NULL,
    inline {blob},
    size INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    created_at {real} NOT NULL
);
-- A second task key with the same 64 bits is not memoised (a lookup checks the full key): see store/memokey.py.
CREATE UNIQUE INDEX outputs_key64 ON outputs_v4 (key64);
INSERT INTO outputs_v4 (key64, task_key, stage, kind, digest, inline, size, run_id, created_at)
SELECT {key64}, task_key, stage, kind, digest, inline, size, run_id, created_at FROM outputs WHERE true
ORDER BY created_at ON CONFLICT (key64) DO NOTHING;
DROP TABLE outputs;
ALTER TABLE outputs_v4 RENAME TO outputs;
""",
    ),
    (
        5,
        "hardening: code fingerprints, run notices, submission heartbeats, byte-ordered keys on PostgreSQL",
        """
-- The fingerprint of the stage code that made a memoised output: a hit made by other code under the
-- same stage version is reported (stale_code) instead of being reused silently.
ALTER TABLE outputs ADD COLUMN code TEXT;
-- A submission holds its run with a heartbeat; a run whose submitter stopped beating is abandoned.
ALTER TABLE runs ADD COLUMN submitter TEXT;
ALTER TABLE runs ADD COLUMN heartbeat_at {real};
ALTER TABLE runs ADD COLUMN note TEXT;
-- Things a run should tell its user once per stage (kind 'stale_code': answered from other code's outputs).
CREATE TABLE run_notices (
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    stage TEXT NOT NULL,
    version TEXT NOT NULL,
    code TEXT,
    count INTEGER NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (run_id, kind, stage)
);
-- `--accept-code-change STAGE`: outputs made under other code of this version are accepted for this code.
CREATE TABLE code_acceptances (
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    version TEXT NOT NULL,
    code TEXT NOT NULL,
    run_id TEXT,
    accepted_at {real} NOT NULL,
    PRIMARY KEY (pipeline, stage, version, code)
);
-- A worker whose leases expired, and how many tasks it held then: its tasks are judged by that count
-- ("it died alone with this one"), however many scans it takes to reclaim them.
CREATE TABLE lost_workers (
    owner TEXT PRIMARY KEY,
    in_flight INTEGER NOT NULL,
    noticed_at {real} NOT NULL
);
-- Manifests that passed the check before a run is created (every line usable, no key twice), by what
-- identifies the file as it was (host, device, inode, size, modification time) and the options: an
-- unchanged manifest is not checked again.
CREATE TABLE checked_inputs (
    path TEXT NOT NULL,
    signature TEXT NOT NULL,
    checked_at {real} NOT NULL,
    PRIMARY KEY (path, signature)
);
{byte_ordered_keys}
""",
    ),
    (
        6,
        "provider calls without a price per attempt, so an unknown cost is never shown as $0",
        """
ALTER TABLE attempts ADD COLUMN unpriced_calls INTEGER NOT NULL DEFAULT 0;
""",
    ),
    (
        7,
        "the acceptance boundary: escalation tiers, manifest meta, verdicts per attempt, the review queue",
        """
-- The escalation tier a task runs at (0: the stage's own config; see conveyor.acceptance.Accept).
ALTER TABLE tasks ADD COLUMN tier INTEGER NOT NULL DEFAULT 0;
-- A manifest line's "meta" object (JSON), for checks of meaning and for slicing reports.
ALTER TABLE items ADD COLUMN meta TEXT;
-- What the acceptance boundary made of an attempt's answer (NULL: the stage declares none).
ALTER TABLE attempts ADD COLUMN tier INTEGER;
ALTER TABLE attempts ADD COLUMN repaired INTEGER;
ALTER TABLE attempts ADD COLUMN confidence {real};
-- Answers waiting for people: the task is 'awaiting_review' while its entry is undecided; no lease is held.
CREATE TABLE reviews (
    id {id},
    task_id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    item_key TEXT NOT NULL,
    stage TEXT NOT NULL,
    reason_class TEXT NOT NULL,
    reason TEXT,
    confidence {real},
    tier INTEGER NOT NULL,
    candidate_kind TEXT NOT NULL,
    candidate_digest TEXT NOT NULL,
    candidate_inline {blob},
    candidate_size INTEGER NOT NULL,
    deadline_at {real} NOT NULL,
    on_deadline TEXT NOT NULL,
    created_at {real} NOT NULL,
    decided_at {real},
    decision TEXT,
    decided_by TEXT,
    why TEXT,
    edits TEXT
);
CREATE INDEX reviews_open ON reviews (pipeline, deadline_at) WHERE decided_at IS NULL;
CREATE INDEX reviews_run ON reviews (run_id, item_key);
""",
    ),
    (
        8,
        "the built-in publication target: versioned records, their vectors, a full-text index of the live ones",
        """
-- Every publication of an item is a version; at most one version of an item is live. A rollback is a
-- version too (a copy of the content it restores), and a retraction a version with nothing live after it.
CREATE TABLE publications (
    id {id},
    collection TEXT NOT NULL,
    item_key TEXT NOT NULL,
    version INTEGER NOT NULL,
    action TEXT NOT NULL,
    live INTEGER NOT NULL,
    fields TEXT,
    text TEXT,
    digest TEXT,
    pipeline TEXT,
    run_id TEXT,
    task_id BIGINT,
    replaces BIGINT,
    restores INTEGER,
    created_at {real} NOT NULL,
    created_by TEXT NOT NULL,
    reason TEXT,
    UNIQUE (item_key, collection, version)
);
CREATE UNIQUE INDEX publications_live ON publications (collection, item_key) WHERE live = 1;
CREATE INDEX publications_live_run ON publications (run_id) WHERE live = 1;
-- A version's embeddings: little-endian float32, n in the order the record gave them.
CREATE TABLE publication_vectors (
    publication_id BIGINT NOT NULL,
    n INTEGER NOT NULL,
    dim INTEGER NOT NULL,
    vector {blob} NOT NULL,
    PRIMARY KEY (publication_id, n)
);
{publication_text_index}
""",
    ),
    (
        9,
        "provenance as indexed rows, replays, budgets and pauses, an index of the tasks that did not succeed",
        """
-- What made each task's output, beyond its stage_version and config_hash columns and its item's source digest:
-- the model asked for and the revision the provider reported, the prompt version, the versions a stage
-- declares or sets. One row per (task, name, value); sort_key orders values as versions (1.24.9 < 1.24.10).
CREATE TABLE provenance (
    run_id TEXT NOT NULL,
    root_key TEXT{bytes_order} NOT NULL,
    item_key TEXT{bytes_order} NOT NULL,
    stage TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    sort_key TEXT{bytes_order} NOT NULL,
    PRIMARY KEY (run_id, root_key, item_key, stage, name, value)
);
CREATE INDEX provenance_values ON provenance (run_id, name, sort_key);
-- An attempt's config hash (the task's may change when a replay runs it under new config) and its provenance
-- document (JSON, NULL when it has nothing beyond its columns); a memoised output's document, which a memo
-- answer carries over to the task it answers.
ALTER TABLE attempts ADD COLUMN config_hash TEXT;
ALTER TABLE attempts ADD COLUMN provenance TEXT;
ALTER TABLE outputs ADD COLUMN provenance TEXT;
-- Replays: selections of tasks run again, with their reason; each task a replay re-opened names it.
CREATE TABLE replays (
    id {id},
    reason TEXT NOT NULL,
    note TEXT,
    selection TEXT NOT NULL,
    downstream INTEGER NOT NULL,
    reopened INTEGER NOT NULL,
    superseded INTEGER NOT NULL,
    runs TEXT NOT NULL,
    created_at {real} NOT NULL,
    created_by TEXT NOT NULL
);
ALTER TABLE tasks ADD COLUMN replay_id BIGINT;
-- The tasks that carry an error class (every failed, dead-lettered, rejected or reviewed task does; a success
-- clears it), so a selection of failures is an index range at any run size. The predicate names error_class,
-- not status: the hot path's status changes then cost SQLite nothing here (an IN list over status cost 20%).
CREATE INDEX tasks_unsettled ON tasks (run_id, stage, error_class) WHERE error_class IS NOT NULL;
-- A run's ceiling on provider spending (USD), what its settled calls cost and what its calls in flight reserve;
-- and why it is paused ('budget' or 'breaker'; its note says more): no task of a paused run is claimed.
ALTER TABLE runs ADD COLUMN budget_usd {real};
ALTER TABLE runs ADD COLUMN spent_usd {real} NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN reserved_usd {real} NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN paused TEXT;
""",
    ),
    (
        10,
        "the HTTP service: tenants and API tokens, jobs, idempotency keys, the event outbox and its webhooks",
        """
-- A tenant owns jobs; its webhook secret (Standard Webhooks, whsec_...) signs every delivery to it.
CREATE TABLE tenants (
    tenant TEXT PRIMARY KEY,
    webhook_secret TEXT NOT NULL,
    created_at {real} NOT NULL
);
-- API tokens, kept as sha256 digests of the token (the token itself is shown once, at creation).
CREATE TABLE api_tokens (
    token_id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    operator INTEGER NOT NULL DEFAULT 0,
    label TEXT,
    created_at {real} NOT NULL,
    revoked_at {real}
);
-- A job is a run the API created: one document (kind 'job', its item item_key) or a manifest (kind 'batch');
-- its id is the run's.
-- outcome and finished_at are set when no task of the run is open any more (a replay clears them again).
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    item_key TEXT,
    pipeline TEXT NOT NULL,
    lane TEXT NOT NULL,
    webhook_url TEXT,
    metadata TEXT,
    request_hash TEXT NOT NULL,
    idempotency_key TEXT,
    created_at {real} NOT NULL,
    finished_at {real},
    outcome TEXT
);
CREATE INDEX jobs_tenant ON jobs (tenant, created_at);
-- Idempotency-Key: (tenant, key) names one job while the key is kept (service/jobs.py: IDEMPOTENCY_TTL_S).
CREATE TABLE idempotency_keys (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    job_id TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
-- The outbox: every event of a job, written in the transaction of the change it tells of. Its id is the
-- event's identity (SSE's id, the webhook-id). delivery is NULL (no webhook), 'pending', 'delivered' or 'failed'.
CREATE TABLE events (
    id {id},
    job_id TEXT NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at {real} NOT NULL,
    delivery TEXT,
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    next_delivery_at {real},
    delivery_lease_until {real},
    delivered_at {real},
    delivery_error TEXT
);
CREATE INDEX events_job ON events (job_id, id);
-- A run per job: finding a pipeline's latest run (the base a run copies settled items from) and listing the
-- newest runs must not read every run.
CREATE INDEX runs_pipeline_created ON runs (pipeline, created_at);
CREATE INDEX runs_created ON runs (created_at);
CREATE INDEX events_pending ON events (next_delivery_at) WHERE delivery = 'pending';
""",
    ),
    (
        11,
        "the fleet: workers register themselves and beat with their lease keeping (conveyor workers)",
        """
-- One row per worker process (its id: host:pid:nonce). heartbeat_at is written by the worker's lease keeper
-- every beat_s; stopped_at at a clean exit. A worker whose beat is older than a few beats is lost.
CREATE TABLE workers (
    worker TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    pipeline TEXT NOT NULL,
    run_id TEXT,
    beat_s {real} NOT NULL,
    started_at {real} NOT NULL,
    heartbeat_at {real} NOT NULL,
    tasks_held INTEGER NOT NULL DEFAULT 0,
    tasks_done INTEGER NOT NULL DEFAULT 0,
    stopped_at {real}
);
CREATE INDEX workers_heartbeat ON workers (heartbeat_at);
""",
    ),
    (
        12,
        "Prometheus metrics: running totals kept by the commits that cause them, dead letters by age",
        """
-- Counters (tasks finished, retries, dead letters, attempt-duration buckets, tokens, cost, 429s, items accepted
-- and published), incremented in the transaction of the commit that causes them, so a scrape reads a few rows
-- instead of the attempts table. labels: the label values, joined by U+001F. shard: a writer process's slot
-- (its pid mod 16), so concurrent PostgreSQL commits seldom wait on one row; a scrape sums the shards.
CREATE TABLE metric_totals (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    shard INTEGER NOT NULL,
    value {real} NOT NULL,
    PRIMARY KEY (name, labels, shard)
);
-- Dead letters of the last hour, read at every scrape.
CREATE INDEX dead_letters_created ON dead_letters (created_at);
""",
    ),
    (
        13,
        "a run's running totals (task states, attempts, usage, timeline), kept by the transactions that change them",
        """
-- A few rows per run that status, progress and the dashboard read instead of grouping its task and attempt rows
-- (store/runtotals.py says what each name counts). shard: a writer process's slot, as in metric_totals.
CREATE TABLE run_totals (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    k1 TEXT NOT NULL,
    k2 TEXT NOT NULL,
    k3 TEXT NOT NULL,
    shard INTEGER NOT NULL,
    value {real} NOT NULL,
    PRIMARY KEY (run_id, name, k1, k2, k3, shard)
){without_rowid};
-- What the store holds already is counted once, by the statements of store/runtotals.py RECOUNT.
""" + RECOUNT.replace("{only}", "").replace("{only_a}", "") + """""",
    ),
    (
        14,
        "alerts on rates: a state row per declared alert, events that are not a job's",
        """
-- One row per (pipeline, alert) a pipeline declares (conveyor.Alerts). state is 'ok' or 'firing'; since: when it
-- entered that state; firings: how many times it fired. Any worker or server may evaluate an alert: a transition
-- is a change of this row under its lock, so a fleet raises (and resolves) each episode once. evaluated_at lets
-- the others skip an evaluation made a moment ago.
CREATE TABLE alerts (
    pipeline TEXT NOT NULL,
    alert TEXT NOT NULL,
    state TEXT NOT NULL,
    value {real} NOT NULL,
    threshold {real} NOT NULL,
    since {real} NOT NULL,
    evaluated_at {real} NOT NULL,
    firings INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pipeline, alert)
);
-- An event that is not a job's (alert.firing, alert.resolved): where it goes and the tenant whose webhook
-- secret signs it (NULL for a job's event: the job says both). job_id then names the alert (alert:PIPELINE:NAME).
ALTER TABLE events ADD COLUMN webhook_url TEXT;
ALTER TABLE events ADD COLUMN tenant TEXT;
""",
    ),
    (
        15,
        "traces: an item's trace context (W3C traceparent), stored with it when it is traced",
        """
-- NULL unless tracing was on when the item was admitted and the sampler kept it (runtime/tracing.py). Set on
-- root items only: a fan-out child's attempts join its root's trace.
ALTER TABLE items ADD COLUMN traceparent TEXT;
""",
    ),
    (
        16,
        "queue counts: open tasks per (pipeline, stage, second of available_at)",
        OPEN_TASK_SECONDS,
    ),
    (
        17,
        "the provider batch lane: requests parked for a provider's Batch API, the batches made of them",
        """
-- One row per distinct model request of a batch-lane stage (custom_id: a hash of the task key and the request),
-- as the provider takes it (body, JSON). state: pending (waits for a batch), packed (in provider_batches row
-- batch_id), answered (answer: the provider's response body), failed (a terminal error: error_class, error) or
-- direct (expired, past its deadline or out of batch retries: the stage calls the model directly).
CREATE TABLE provider_batch_requests (
    custom_id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    model TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    batch_id BIGINT,
    tries INTEGER NOT NULL DEFAULT 0,
    max_tries INTEGER NOT NULL,
    answer TEXT,
    error_class TEXT,
    error TEXT,
    created_at {real} NOT NULL,
    deadline_at {real} NOT NULL,
    settled_at {real}
);
CREATE INDEX provider_batch_requests_pending ON provider_batch_requests (pipeline, model, created_at)
    WHERE state = 'pending';
CREATE INDEX provider_batch_requests_batch ON provider_batch_requests (batch_id) WHERE state = 'packed';
-- The tasks parked on a request (queued, not claimable before the request's deadline: woken when it settles).
CREATE TABLE provider_batch_waiters (
    custom_id TEXT NOT NULL,
    task_id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (custom_id, task_id)
);
CREATE INDEX provider_batch_waiters_task ON provider_batch_waiters (task_id);
-- One row per batch file. tag: a hash of its content, written into the provider batch's metadata before it is
-- created, so a keeper that died between creating it and recording provider_batch_id adopts it instead of
-- paying twice. state: creating (provider_batch_id NULL until created or adopted), submitted, ended.
CREATE TABLE provider_batches (
    id {id},
    pipeline TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    tag TEXT NOT NULL UNIQUE,
    provider_batch_id TEXT,
    state TEXT NOT NULL,
    status TEXT,
    requests INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    create_tries INTEGER NOT NULL DEFAULT 0,
    created_at {real} NOT NULL,
    submitted_at {real},
    next_poll_at {real},
    polls INTEGER NOT NULL DEFAULT 0,
    ended_at {real},
    answered INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    retried INTEGER NOT NULL DEFAULT 0,
    direct INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX provider_batches_open ON provider_batches (pipeline, state) WHERE state <> 'ended';
-- Who keeps a pipeline's provider batches (packs, creates, polls): one worker of the fleet at a time, by lease.
CREATE TABLE provider_batch_keepers (
    pipeline TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    until {real} NOT NULL
);
""",
    ),
    (
        18,
        "tasks_leased indexes leased tasks by a predicate no fenced one-task statement implies",
        """
-- A fenced statement names one task (WHERE id = ? AND lease_token = ? AND status = 'running'): it must be served
-- from the primary key. With the old predicate (status = 'running') PostgreSQL could serve it from this index
-- instead, walking every leased task, when its statistics judged the index empty (store/records.py LEASED).
DROP INDEX tasks_leased;
CREATE INDEX tasks_leased ON tasks (pipeline, lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;
""",
    ),
    (
        19,
        "a task key means one thing in every process: claims by declaration, run parameters, declarations served",
        """
-- A worker claims only the tasks made under its own declaration of their stage (stage version and config hash):
-- the runnable index leads with them, so a worker of another declaration never scans past a backlog it may not
-- take (a rolling deploy: old workers drain the old tasks while new workers take the new ones).
DROP INDEX tasks_runnable;
CREATE INDEX tasks_runnable ON tasks (pipeline, stage, stage_version, config_hash, lane_rank, available_at)
    WHERE status = 'queued' AND crashes = 0;
-- The run's parameters (conveyor.pipeline.params), as canonical JSON: what its workers, resumes and replays use.
ALTER TABLE runs ADD COLUMN params TEXT;
-- What each worker serves: a JSON object of stage to [version, config hash] (conveyor workers; status names the
-- runs whose tasks no live worker can take).
ALTER TABLE workers ADD COLUMN serves TEXT;
-- Each declaration of a stage seen by a submission or a worker, with its config, so that the difference between
-- a run's declaration and a worker's can be named, not only seen as two hashes.
CREATE TABLE stage_declarations (
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    version TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    config TEXT NOT NULL,
    seen_at {real} NOT NULL,
    PRIMARY KEY (pipeline, stage, version, config_hash)
);
""",
    ),
    (
        20,
        "webhook deliveries in order per job: a job's pending events by id",
        """
-- The relay sends an event only when no earlier event of its job is pending (store/jobs.py _DUE): that question
-- reads this index, not every event the job ever had.
CREATE INDEX events_pending_job ON events (job_id, id) WHERE delivery = 'pending';
""",
    ),
    (
        21,
        "budget reservations held by the lease of the task that made them",
        """
-- One row per provider call in flight of a run with a budget: its reservation (usd, an estimate), held by the lease
-- of the task that made it (task_id, lease_token). runs.reserved_usd is their sum; settling the call deletes the
-- row. When the lease ends without the call settling (its worker died, or stalled past its lease), the
-- reservation is lost (lost = 1): counted as spent at its estimate, since the provider was probably paid, until a
-- late settlement says what the call cost.
CREATE TABLE budget_reservations (
    id {id},
    run_id TEXT NOT NULL,
    task_id BIGINT,
    lease_token INTEGER,
    usd {real} NOT NULL,
    lost INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX budget_reservations_run ON budget_reservations (run_id) WHERE lost = 0;
CREATE INDEX budget_reservations_task ON budget_reservations (task_id) WHERE lost = 0;
""",
    ),
    (
        22,
        "waiting is never paid twice: tasks awaiting review found by key, a journal of each task's model answers",
        """
-- A task whose key already waits for review waits on that answer (no call, no second entry), and one decision
-- settles every task waiting under the key: both find the waiting tasks by key.
CREATE INDEX tasks_awaiting_review ON tasks (task_key) WHERE status = 'awaiting_review';
CREATE INDEX reviews_task ON reviews (task_id);
-- The answers of the model calls a task's attempts made (runtime/journal.py), by the call's request: the next
-- attempt of the task is answered from here instead of paying again. Cleared when the task ends.
CREATE TABLE call_answers (
    task_id BIGINT NOT NULL,
    call_key TEXT NOT NULL,
    answer TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (task_id, call_key)
);
""",
    ),
    (
        23,
        "group stages: the groups each run still has to make, and group keys memoised by output",
        """
-- A run's group stages (kind "group" or "reduce") make their groups once every item of the run has settled at
-- their parent (runtime/transitions/groups.py): one row each from the run's creation; made_at once made.
CREATE TABLE group_waits (
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    made_at {real},
    PRIMARY KEY (run_id, stage)
);
CREATE INDEX group_waits_open ON group_waits (pipeline) WHERE made_at IS NULL;
-- The group key a group stage's by= function gave a member's output (by the stage's declaration and the
-- output's digest): a re-run groups its members without reading their outputs again.
CREATE TABLE group_keys (
    declaration TEXT NOT NULL,
    digest TEXT NOT NULL,
    group_key TEXT NOT NULL,
    PRIMARY KEY (declaration, digest)
);
""",
    ),
    (
        24,
        "search by meaning: the model that made each publication's vectors, the state of the vector indexes",
        """
-- The embedding model that made a version's vectors (Record(embedding_model=...)): a query is embedded with the
-- same one. NULL: the version has no vectors; '': it has vectors from a model nobody recorded.
ALTER TABLE publications ADD COLUMN vector_model TEXT;
UPDATE publications SET vector_model = '' WHERE id IN (SELECT publication_id FROM publication_vectors);
CREATE INDEX publications_live_models ON publications (collection, vector_model) WHERE live = 1;
-- The exact scan of a collection's live vectors (no vector index) walks its live versions in id order.
CREATE INDEX publications_live_ids ON publications (collection, id) WHERE live = 1;
-- SQLite's vector indexes (store/vectors.py): one sqlite-vec table per dimension, made by the first search at
-- that dimension and kept in step with the live versions by every publication and rollback after it; stale = 1
-- when a process without sqlite-vec changed what is live, so the next search makes it again.
CREATE TABLE publication_vector_indexes (
    dim INTEGER PRIMARY KEY,
    stale INTEGER NOT NULL
);
""",
    ),
    (
        26,
        "the console's items table: a run's tasks of one stage in key order, full-text search over error messages",
        """
-- The items page (service/itemtable.py) lists a run's tasks in key order (root, item, stage: the order of the
-- tasks' unique index) a page at a time; filtered by stage, it walks this index instead of every task of the run.
-- The stage is indexed as the expression `stage || ''`, which only that page's query says: an index on
-- (run_id, stage, ...) would be taken by the planners for the queue's own queries (claims, the oldest queued
-- task of a stage: 0.3 ms became 600 ms at 100,000 items) instead of their partial indexes.
CREATE INDEX tasks_run_stage_key ON tasks (run_id, (stage || ''), root_key, item_key);
-- The words of the error messages of tasks with an error class (store/errortext.py).
{task_error_text};
""",
    ),
    (
        27,
        "attempts keep the lines their stage logged through ctx.log, and an answer's text before its repair",
        """
-- The lines a stage logged through ctx.log in this attempt (runtime/attemptlog.py: JSON [[seconds, level,
-- message], ...], at most 200 lines and 64 KiB), written with the attempt's row; logs_dropped counts the lines
-- past that bound. Read by item (`conveyor show --logs`, the item page) through attempts_run_task.
ALTER TABLE attempts ADD COLUMN logs TEXT;
ALTER TABLE attempts ADD COLUMN logs_dropped INTEGER NOT NULL DEFAULT 0;
-- The answer's text as the stage returned it, when the acceptance boundary repaired its format before judging it
-- (acceptance/repair.py; cut at 20,000 characters): the item page shows it beside the record that was kept.
ALTER TABLE attempts ADD COLUMN unrepaired TEXT;
""",
    ),
    (
        28,
        "a fan-out child's tasks carry the number of children its parent's fan-out made",
        """
-- A task on a fan-out child item (parent¶index) carries how many children that fan-out made (0: not a child's
-- task, or not known: then the gather reads its children's rows). A commit that settles every child of a parent
-- decides the gather from the count alone, without reading the run (runtime/expand.py); a replay's fan-out that
-- makes another number of children writes the new count on every child's row (store/tasks.py: _revives).
ALTER TABLE tasks ADD COLUMN siblings INTEGER NOT NULL DEFAULT 0;
""",
    ),
    (
        29,
        "SQLite: no items-page stage index (its planner never took it; it doubled the cost of inserting a task)",
        """
-- tasks_run_stage_key (migration 26) serves the items page's stage filter on PostgreSQL. SQLite's planner pages
-- that filter through the tasks' unique index instead (bench/dashboard.py's EXPLAIN), while the index cost every
-- task insert half its time (27 against 14 us a row, bench/fleetprofile.py): on SQLite it goes.
{items_stage_index_drop};
""",
    ),
    (
        31,
        "PostgreSQL: no items-page stage index either (an entry on every task write of the hot path)",
        """
-- tasks_run_stage_key (migration 26) made an index entry on every task written: each new task, and each claim,
-- success or retry (none of them can be a HOT update: the status is in the queue's partial indexes). It served
-- only the items page's stage filter, which now walks the tasks' unique index in key order as SQLite's does
-- (migration 29): a page of a stage that most items reach reads a few times its rows, of a rare stage more.
-- Two workers through 20,000 items: the server's CPU 57 -> 49 us a task (bench/RESULTS.md, issue 32).
DROP INDEX IF EXISTS tasks_run_stage_key;
""",
    ),
    (
        33,
        "SQLite: no insert trigger for the error messages' index (the two inserts of a task with an error index it)",
        """
-- A trigger costs every statement it is compiled into about 1 us a row, its WHEN clause false or not: this one was
-- in every task insert, though only a refusal answered from the memo and an unreadable input are inserted with an
-- error. Those two inserts now index their new rows themselves (store/errortext.py index_new_errors); updates
-- keep their trigger (a success sets no column it watches). Two workers through 20,000 items: bench/RESULTS.md.
{task_error_text_insert_drop};
""",
    ),
]
