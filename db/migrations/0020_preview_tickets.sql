-- Preview tickets (DESIGN §14, docs/previews.md "Signing in on the preview origin"): Berth's
-- origin mints one for a signed-in member who opens a preview; the preview origin exchanges it,
-- once, within 60 s, for a preview-only cookie. Only the sha256 of a ticket is stored.
CREATE TABLE preview_tickets (
    token_hash  bytea PRIMARY KEY,
    company_id  uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    service_id  uuid NOT NULL REFERENCES runtime_services (id) ON DELETE CASCADE,
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL,
    consumed_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (expires_at <= created_at + interval '60 seconds')
);
CREATE INDEX preview_tickets_expires_idx ON preview_tickets (expires_at);
