-- One live run per task and Idempotency-Key on run creation (docs/runs.md "One live run per
-- task"), and where a head-and-tail log splits (docs/runs.md "Logs").

-- Settle tasks that already have more than one live run, deterministically: the newest live run
-- of a task (by created_at, then id) stays; every older live one ends failed with error_code
-- superseded. Their leases expire at their TTL and are cleaned as usual (expire_leases).
UPDATE runs r SET status = 'failed', error_code = 'superseded',
        error_message = 'A newer run of the task was live when Berth began allowing one live run per task.',
        finished_at = coalesce(r.finished_at, now())
    WHERE r.task_id IS NOT NULL AND r.status IN ('queued', 'preparing', 'running')
        AND EXISTS (SELECT 1 FROM runs n WHERE n.task_id = r.task_id
            AND n.status IN ('queued', 'preparing', 'running') AND (n.created_at, n.id) > (r.created_at, r.id));

-- At most one queued, preparing or running run per task: the database refuses a second.
CREATE UNIQUE INDEX runs_one_live_per_task ON runs (task_id) WHERE status IN ('queued', 'preparing', 'running');

-- An Idempotency-Key given to POST /api/tasks/{id}/runs, per principal, for 24 hours: the same key
-- answers with the same run; the same key on another task is refused.
CREATE TABLE run_idempotency_keys (
    principal  text NOT NULL,
    key        text NOT NULL,
    company_id uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    task_id    uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id     uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);
CREATE INDEX run_idempotency_keys_run_idx ON run_idempotency_keys (run_id);
CREATE INDEX run_idempotency_keys_task_idx ON run_idempotency_keys (task_id);

-- How many leading bytes of a run's stored log are the first bytes it printed; after them, when
-- the log was truncated, come the marker line and the kept tail. NULL: all of the stored log
-- (runs written before head-and-tail logs, and logs under the cap).
ALTER TABLE runs ADD COLUMN log_head_bytes integer;
