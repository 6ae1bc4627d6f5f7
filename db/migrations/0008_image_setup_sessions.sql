-- Image setup sessions and terminal tokens (docs/terminal.md). A setup session is an instance
-- admin's shell in a setup jail over a scratch copy of an environment's active image layer; finish
-- captures the scratch layer into the next numbered image version. At most one live session per
-- environment. Terminal tokens admit one WebSocket attach to a session: stored as sha256 only,
-- short-lived, consumed once.

CREATE TABLE image_setup_sessions (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id     uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    environment_id uuid NOT NULL,
    base_version   integer NOT NULL CHECK (base_version >= 1),
    user_id        uuid REFERENCES users (id) ON DELETE SET NULL,
    status         text NOT NULL CHECK (status IN ('starting', 'waiting_for_user', 'capturing', 'promoted',
                       'cancelled', 'timed_out', 'failed')),
    expires_at     timestamptz NOT NULL,
    result_version integer CHECK (result_version >= 1),
    error          text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    FOREIGN KEY (company_id, environment_id) REFERENCES environments (company_id, id) ON DELETE CASCADE,
    CHECK ((status = 'promoted') = (result_version IS NOT NULL)),
    UNIQUE (company_id, id)
);

-- At most one live session per environment.
CREATE UNIQUE INDEX image_setup_sessions_one_live_idx ON image_setup_sessions (environment_id)
    WHERE status IN ('starting', 'waiting_for_user', 'capturing');
-- The expiry sweep reads live sessions by expiry.
CREATE INDEX image_setup_sessions_live_expiry_idx ON image_setup_sessions (expires_at)
    WHERE status IN ('starting', 'waiting_for_user');

-- image_versions.created_by_session stays without a foreign key: a version outlives the session
-- row that captured it, and the id keeps naming it in the audit trail.

CREATE TABLE terminal_tokens (
    token_hash     bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    company_id     uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    session_id     uuid NOT NULL REFERENCES image_setup_sessions (id) ON DELETE CASCADE,
    user_id        uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    environment_id uuid NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    consumed_at    timestamptz,
    CHECK (expires_at > created_at AND expires_at <= created_at + interval '60 seconds')
);

CREATE INDEX terminal_tokens_expires_idx ON terminal_tokens (expires_at);
