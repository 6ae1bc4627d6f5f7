-- Core domain: projects, their workspaces, environments, tasks, agents, bindings, and the
-- execution workspaces and leases that bindings and archiving rules refer to.

CREATE TABLE environments (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id    uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    driver        text NOT NULL CHECK (driver IN ('local', 'ssh', 'sandbox')),
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    config        jsonb NOT NULL DEFAULT '{}',
    -- AES-GCM sealed JSON object of secret values (ssh private key, secret env values); never returned.
    secrets       bytea,
    qualification jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (company_id, name),
    UNIQUE (company_id, id)
);

CREATE TABLE projects (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id       uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    key              text NOT NULL CHECK (key ~ '^[A-Z][A-Z0-9]{1,9}$'),
    description      text NOT NULL DEFAULT '' CHECK (length(description) <= 10000),
    execution_policy jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    next_task_number integer NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (company_id, key),
    UNIQUE (company_id, id)
);

CREATE TABLE project_workspaces (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id      uuid NOT NULL,
    project_id      uuid NOT NULL,
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    source_type     text NOT NULL CHECK (source_type IN ('git', 'directory')),
    source          text NOT NULL CHECK (length(source) BETWEEN 1 AND 4096),
    default_ref     text NOT NULL DEFAULT '' CHECK (length(default_ref) <= 255),
    setup_command   text NOT NULL DEFAULT '' CHECK (length(setup_command) <= 10000),
    cleanup_command text NOT NULL DEFAULT '' CHECK (length(cleanup_command) <= 10000),
    is_primary      boolean NOT NULL DEFAULT false,
    services        jsonb NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (company_id, project_id) REFERENCES projects (company_id, id) ON DELETE CASCADE,
    UNIQUE (project_id, name),
    UNIQUE (company_id, id)
);
-- Exactly one primary per project at most; the API keeps it at exactly one when any exist.
CREATE UNIQUE INDEX project_workspaces_one_primary ON project_workspaces (project_id) WHERE is_primary;

CREATE TABLE agents (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id  uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    description text NOT NULL DEFAULT '' CHECK (length(description) <= 2000),
    disabled_at timestamptz,
    created_by  uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (company_id, name),
    UNIQUE (company_id, id)
);
ALTER TABLE api_tokens ADD COLUMN agent_id uuid REFERENCES agents (id) ON DELETE CASCADE;

CREATE TABLE tasks (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id     uuid NOT NULL,
    project_id     uuid NOT NULL,
    number         integer NOT NULL CHECK (number > 0),
    key            text NOT NULL,
    title          text NOT NULL CHECK (length(title) BETWEEN 1 AND 300),
    description    text NOT NULL DEFAULT '' CHECK (length(description) <= 100000),
    status         text NOT NULL DEFAULT 'todo' CHECK (status IN ('todo', 'in_progress', 'in_review', 'done', 'cancelled')),
    command        text NOT NULL DEFAULT '' CHECK (length(command) <= 10000),
    trust          text NOT NULL DEFAULT 'standard' CHECK (trust IN ('standard', 'low')),
    workspace_mode text NOT NULL DEFAULT 'inherit' CHECK (workspace_mode IN ('inherit', 'shared', 'isolated', 'reuse')),
    environment_id uuid,
    created_by     uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (company_id, project_id) REFERENCES projects (company_id, id) ON DELETE CASCADE,
    FOREIGN KEY (company_id, environment_id) REFERENCES environments (company_id, id),
    UNIQUE (project_id, number),
    UNIQUE (company_id, key),
    UNIQUE (company_id, id)
);
CREATE INDEX tasks_project_list_idx ON tasks (project_id, number DESC);
CREATE INDEX tasks_project_status_idx ON tasks (project_id, status, number DESC);

CREATE TABLE execution_workspaces (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id           uuid NOT NULL,
    project_id           uuid NOT NULL,
    project_workspace_id uuid REFERENCES project_workspaces (id) ON DELETE SET NULL,
    source_task_id       uuid REFERENCES tasks (id) ON DELETE SET NULL,
    mode                 text NOT NULL CHECK (mode IN ('shared', 'isolated')),
    strategy             text NOT NULL CHECK (strategy IN ('shared', 'git_worktree', 'copy')),
    trust                text NOT NULL DEFAULT 'standard' CHECK (trust IN ('standard', 'low')),
    status               text NOT NULL DEFAULT 'preparing' CHECK (status IN ('preparing', 'ready', 'failed', 'closing', 'closed', 'cleanup_failed')),
    finalize_state       text NOT NULL DEFAULT 'none' CHECK (finalize_state IN ('none', 'pending', 'settled', 'failed')),
    generation           bigint NOT NULL DEFAULT 1,
    ref                  text NOT NULL UNIQUE CHECK (ref ~ '^ws-[0-9a-f]{32}$'),
    cwd                  text NOT NULL DEFAULT '',
    base_ref             text NOT NULL DEFAULT '',
    base_commit          text NOT NULL DEFAULT '',
    branch               text NOT NULL DEFAULT '',
    base_tree_digest     text NOT NULL DEFAULT '',
    reusable             boolean NOT NULL DEFAULT true,
    plan                 jsonb NOT NULL DEFAULT '{}',
    closed_at            timestamptz,
    cleanup_reason       text NOT NULL DEFAULT '',
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (company_id, project_id) REFERENCES projects (company_id, id) ON DELETE CASCADE,
    UNIQUE (company_id, id)
);
CREATE INDEX execution_workspaces_project_idx ON execution_workspaces (project_id, status);

CREATE TABLE task_workspace_bindings (
    task_id                uuid PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    company_id             uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    execution_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    mode                   text NOT NULL CHECK (mode IN ('inherit', 'shared', 'isolated', 'reuse')),
    revision               bigint NOT NULL CHECK (revision > 0),
    request_key            text NOT NULL CHECK (length(request_key) BETWEEN 1 AND 200),
    request_hash           bytea NOT NULL,
    updated_by             uuid,
    updated_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX task_workspace_bindings_ws_idx ON task_workspace_bindings (execution_workspace_id);

-- Every accepted binding change keeps its request key, so a replay returns the same answer.
CREATE TABLE task_binding_requests (
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    request_key  text NOT NULL,
    request_hash bytea NOT NULL,
    response     jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, request_key)
);

CREATE TABLE environment_leases (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id             uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    environment_id         uuid REFERENCES environments (id) ON DELETE SET NULL,
    execution_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    task_id                uuid REFERENCES tasks (id) ON DELETE SET NULL,
    run_id                 uuid,
    status                 text NOT NULL DEFAULT 'acquiring' CHECK (status IN ('acquiring', 'active', 'releasing', 'released', 'expired', 'failed')),
    generation             bigint NOT NULL DEFAULT 1,
    provider_ref           text NOT NULL DEFAULT '',
    acquired_at            timestamptz,
    heartbeat_at           timestamptz,
    expires_at             timestamptz,
    released_at            timestamptz,
    cleanup_status         text NOT NULL DEFAULT 'none' CHECK (cleanup_status IN ('none', 'pending', 'succeeded', 'failed')),
    cleanup_attempts       integer NOT NULL DEFAULT 0,
    failure_reason         text NOT NULL DEFAULT '',
    created_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX environment_leases_env_live_idx ON environment_leases (environment_id) WHERE status IN ('acquiring', 'active', 'releasing');
CREATE INDEX environment_leases_company_idx ON environment_leases (company_id, created_at DESC);

CREATE INDEX audit_events_company_filter_idx ON audit_events (company_id, action, at DESC);
