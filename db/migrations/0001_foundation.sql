-- Foundation: tenancy, people, credentials, sessions and the audit trail.

CREATE TABLE companies (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    slug       text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email             text NOT NULL CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),
    password_hash     text NOT NULL,
    is_instance_admin boolean NOT NULL DEFAULT false,
    disabled_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_email_key ON users (email);

CREATE TABLE memberships (
    company_id uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role       text NOT NULL CHECK (role IN ('board', 'viewer')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id);

-- API tokens: only the sha256 of the token is stored. Run tokens (kind 'run') arrive with runs.
CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    token_hash   bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    kind         text NOT NULL DEFAULT 'user' CHECK (kind IN ('user', 'run')),
    name         text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    user_id      uuid REFERENCES users (id) ON DELETE CASCADE,
    run_id       uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz,
    CHECK (kind <> 'user' OR user_id IS NOT NULL)
);
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id);

-- Audit events outlive what they describe: no foreign keys to actors or targets.
CREATE TABLE audit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    company_id  uuid REFERENCES companies (id) ON DELETE SET NULL,
    actor_type  text NOT NULL CHECK (actor_type IN ('user', 'agent', 'system', 'anonymous')),
    actor_id    uuid,
    actor_label text NOT NULL DEFAULT '',
    action      text NOT NULL,
    target_type text NOT NULL DEFAULT '',
    target_id   text NOT NULL DEFAULT '',
    details     jsonb NOT NULL DEFAULT '{}',
    ip          text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_events_company_at_idx ON audit_events (company_id, at DESC, id DESC);
CREATE INDEX audit_events_at_idx ON audit_events (at DESC, id DESC);

-- Login attempts feed the per-account and per-address rate limit; housekeeping prunes them.
CREATE TABLE login_attempts (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL,
    ip    text NOT NULL,
    ok    boolean NOT NULL,
    at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_attempts_email_at_idx ON login_attempts (email, at);
CREATE INDEX login_attempts_ip_at_idx ON login_attempts (ip, at);

-- Browser sessions (alexedwards/scs pgxstore layout).
CREATE TABLE sessions (
    token  text PRIMARY KEY,
    data   bytea NOT NULL,
    expiry timestamptz NOT NULL
);
CREATE INDEX sessions_expiry_idx ON sessions (expiry);
