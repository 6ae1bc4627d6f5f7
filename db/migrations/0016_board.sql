-- The board (issue 25, docs/pages.md): sessions a person can see and end, source roots that
-- instance administrators manage in the UI, and the requests board members send them.

-- Sessions name their user, when they began and the browser they began in, so the settings page
-- can list a person's sessions and sign out the others. db.SessionStore fills these from the
-- session's own data on every save; a row saved before this migration gets them at its next save.
ALTER TABLE sessions
    ADD COLUMN user_id    uuid REFERENCES users (id) ON DELETE CASCADE,
    ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN user_agent text NOT NULL DEFAULT '' CHECK (length(user_agent) <= 200);
CREATE INDEX sessions_user_idx ON sessions (user_id) WHERE user_id IS NOT NULL;

-- Host directories under which board members may point local project workspace sources, besides
-- those of BERTH_SOURCE_ROOTS (which stay in force: the bootstrap default). Instance-level: no
-- company. Paths are absolute and cleaned by the handler; they never reach a non-admin response.
CREATE TABLE source_roots (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    path       text NOT NULL UNIQUE CHECK (path LIKE '/%' AND length(path) <= 4096),
    note       text NOT NULL DEFAULT '' CHECK (length(note) <= 500),
    created_by uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A board member's request to allow a directory that was refused as a source. Instance admins
-- see the open ones; approving adds the path to source_roots, dismissing closes the request.
CREATE TABLE source_root_requests (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id  uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    project_id  uuid REFERENCES projects (id) ON DELETE SET NULL,
    user_id     uuid REFERENCES users (id) ON DELETE SET NULL,
    path        text NOT NULL CHECK (path LIKE '/%' AND length(path) <= 4096),
    status      text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'approved', 'dismissed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_by uuid REFERENCES users (id) ON DELETE SET NULL,
    resolved_at timestamptz
);
-- One open request per company and path: asking twice is answered with the open one.
CREATE UNIQUE INDEX source_root_requests_open_idx ON source_root_requests (company_id, path) WHERE status = 'open';
CREATE INDEX source_root_requests_status_idx ON source_root_requests (status, created_at);
