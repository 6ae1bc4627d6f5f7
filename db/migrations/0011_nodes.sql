-- Nodes (DESIGN §11, docs/scaling.md): every berth serve and berth worker process is a node with a
-- row here, renewed every few seconds; a node silent for longer than the dead-after interval is
-- dead, and the others take over what it held (its runs orphaned, its leases expired at once, its
-- services stopped). taken_over_at records the takeover of the node's current life (a restart
-- sets started_at again, which ends it). Process-bound rows carry the node id that owns them.

CREATE TABLE nodes (
    id            text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._-]{1,64}$'),
    kind          text NOT NULL CHECK (kind IN ('serve', 'worker')),
    -- Where other nodes reach this one's internal listener ('' when it has none).
    internal_url  text NOT NULL DEFAULT '',
    version       text NOT NULL DEFAULT '',
    -- Whether this process fetches jobs (a serve --workers=false node does not).
    works         boolean NOT NULL DEFAULT false,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    taken_over_at timestamptz
);

-- Local execution workspaces live on one node's disk; image setup sessions hold a shell there.
ALTER TABLE execution_workspaces ADD COLUMN node_id text NOT NULL DEFAULT '';
ALTER TABLE image_setup_sessions ADD COLUMN node_id text NOT NULL DEFAULT '';

-- A node's takeover reads its live runs and leases by node.
CREATE INDEX runs_live_node_idx ON runs (node_id) WHERE status IN ('queued', 'preparing', 'running');
