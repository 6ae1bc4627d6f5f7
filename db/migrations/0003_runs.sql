-- Runs and what they leave behind: the operations ledger and work products.

CREATE TABLE runs (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id             uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    task_id                uuid REFERENCES tasks (id) ON DELETE SET NULL,
    execution_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    environment_id         uuid REFERENCES environments (id) ON DELETE SET NULL,
    lease_id               uuid REFERENCES environment_leases (id) ON DELETE SET NULL,
    agent_id               uuid REFERENCES agents (id) ON DELETE SET NULL,
    created_by             uuid REFERENCES users (id) ON DELETE SET NULL,
    status                 text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'preparing', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out')),
    error_code             text NOT NULL DEFAULT '',
    error_message          text NOT NULL DEFAULT '',
    exit_code              integer,
    command                text NOT NULL DEFAULT '',
    plan                   jsonb NOT NULL DEFAULT '{}',
    timeout_s              integer NOT NULL DEFAULT 3600 CHECK (timeout_s BETWEEN 1 AND 86400),
    cancel_requested       boolean NOT NULL DEFAULT false,
    node_id                text NOT NULL DEFAULT '',
    pid                    integer,
    log                    bytea NOT NULL DEFAULT '',
    log_bytes              bigint NOT NULL DEFAULT 0,
    log_truncated          boolean NOT NULL DEFAULT false,
    created_at             timestamptz NOT NULL DEFAULT now(),
    started_at             timestamptz,
    finished_at            timestamptz,
    heartbeat_at           timestamptz
);
CREATE INDEX runs_task_idx ON runs (task_id, created_at DESC);
CREATE INDEX runs_live_idx ON runs (status) WHERE status IN ('queued', 'preparing', 'running');
CREATE INDEX runs_workspace_idx ON runs (execution_workspace_id);

ALTER TABLE environment_leases ADD CONSTRAINT environment_leases_run_fk
    FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE SET NULL;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_run_fk
    FOREIGN KEY (run_id) REFERENCES runs (id) ON DELETE CASCADE;
CREATE INDEX api_tokens_run_idx ON api_tokens (run_id) WHERE run_id IS NOT NULL;

-- One live lease per (environment, execution workspace): the database refuses a double grant.
CREATE UNIQUE INDEX environment_leases_one_live ON environment_leases (environment_id, execution_workspace_id)
    WHERE status IN ('acquiring', 'active', 'releasing');

CREATE TABLE workspace_operations (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id             uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    execution_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    run_id                 uuid REFERENCES runs (id) ON DELETE SET NULL,
    task_id                uuid REFERENCES tasks (id) ON DELETE SET NULL,
    phase                  text NOT NULL CHECK (phase IN ('source_prepare', 'realize', 'setup', 'upload', 'download', 'finalize',
                               'service_start', 'service_stop', 'cleanup', 'teardown')),
    command                text NOT NULL DEFAULT '',
    cwd                    text NOT NULL DEFAULT '',
    status                 text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'succeeded', 'failed', 'skipped')),
    exit_code              integer,
    log                    bytea NOT NULL DEFAULT '',
    log_bytes              bigint NOT NULL DEFAULT 0,
    log_sha256             text NOT NULL DEFAULT '',
    log_truncated          boolean NOT NULL DEFAULT false,
    error                  text NOT NULL DEFAULT '',
    node_id                text NOT NULL DEFAULT '',
    started_at             timestamptz NOT NULL DEFAULT now(),
    finished_at            timestamptz
);
CREATE INDEX workspace_operations_ws_idx ON workspace_operations (execution_workspace_id, started_at);
CREATE INDEX workspace_operations_run_idx ON workspace_operations (run_id, started_at);
CREATE INDEX workspace_operations_running_idx ON workspace_operations (started_at) WHERE status = 'running';

CREATE TABLE work_products (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id             uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    task_id                uuid REFERENCES tasks (id) ON DELETE CASCADE,
    run_id                 uuid REFERENCES runs (id) ON DELETE SET NULL,
    execution_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    kind                   text NOT NULL CHECK (kind IN ('branch', 'commit', 'preview_url', 'artifact', 'file')),
    ref                    text NOT NULL DEFAULT '',
    url                    text NOT NULL DEFAULT '',
    path                   text NOT NULL DEFAULT '',
    metadata               jsonb NOT NULL DEFAULT '{}',
    created_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX work_products_task_idx ON work_products (task_id, created_at DESC);
-- A retried finalize records each product once.
CREATE UNIQUE INDEX work_products_once ON work_products (run_id, kind, ref) WHERE run_id IS NOT NULL;
