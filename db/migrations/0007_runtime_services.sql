-- Runtime services (docs/previews.md): the dev and preview servers Berth runs for an execution
-- workspace. One row per (workspace, service name), created when the service is first started and
-- reused by every restart (same id, same /preview/{id}/ URL, generation + 1). A port is held by at
-- most one live service per node; pid, pgid and process_start (clock ticks since boot, from /proc)
-- identify the server process across a Berth restart without trusting a reused pid.

CREATE TABLE runtime_services (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id             uuid NOT NULL,
    execution_workspace_id uuid NOT NULL,
    project_workspace_id   uuid REFERENCES project_workspaces (id) ON DELETE SET NULL,
    -- The run that started it (a run token) or was live when it started; services outlive runs.
    run_id                 uuid REFERENCES runs (id) ON DELETE SET NULL,
    name                   text NOT NULL CHECK (name ~ '^[a-z0-9-]{1,64}$'),
    command                text NOT NULL DEFAULT '',
    cwd                    text NOT NULL DEFAULT '',
    port                   integer CHECK (port BETWEEN 1 AND 65535),
    status                 text NOT NULL DEFAULT 'stopped' CHECK (status IN ('starting', 'running', 'stopping', 'stopped', 'failed')),
    health                 text NOT NULL DEFAULT 'unknown' CHECK (health IN ('unknown', 'healthy', 'unhealthy')),
    desired_state          text NOT NULL DEFAULT 'stopped' CHECK (desired_state IN ('running', 'stopped')),
    stop_policy            text NOT NULL DEFAULT 'manual' CHECK (stop_policy IN ('manual', 'on_run_finish', 'idle_timeout')),
    lifecycle              text NOT NULL DEFAULT 'ephemeral' CHECK (lifecycle IN ('shared', 'ephemeral')),
    idle_timeout_s         integer NOT NULL DEFAULT 1800 CHECK (idle_timeout_s > 0),
    reuse_key              text NOT NULL DEFAULT '',
    pid                    integer,
    pgid                   integer,
    process_start          bigint,
    node_id                text NOT NULL DEFAULT '',
    -- The Berth process (River client id) whose supervisor owns the process.
    supervisor_id          text NOT NULL DEFAULT '',
    log_path               text NOT NULL DEFAULT '',
    generation             bigint NOT NULL DEFAULT 0,
    restarts               integer NOT NULL DEFAULT 0,
    exit_code              integer,
    log_excerpt            text NOT NULL DEFAULT '',
    stop_reason            text NOT NULL DEFAULT '',
    started_at             timestamptz,
    stopped_at             timestamptz,
    last_request_at        timestamptz,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (company_id, execution_workspace_id) REFERENCES execution_workspaces (company_id, id) ON DELETE CASCADE,
    UNIQUE (execution_workspace_id, name),
    UNIQUE (company_id, id)
);

-- A port belongs to one live service per node.
CREATE UNIQUE INDEX runtime_services_node_port_idx ON runtime_services (node_id, port)
    WHERE status IN ('starting', 'running', 'stopping');
CREATE INDEX runtime_services_live_idx ON runtime_services (node_id)
    WHERE status IN ('starting', 'running', 'stopping') OR desired_state = 'running';
