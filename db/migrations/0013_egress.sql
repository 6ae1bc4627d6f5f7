-- Egress by policy (DESIGN §15, docs/network.md): what a run reached and what was refused, kept
-- with the run for its page; a refused connection is also a step of the workspace's ledger.
ALTER TABLE runs ADD COLUMN egress jsonb;

ALTER TABLE workspace_operations DROP CONSTRAINT workspace_operations_phase_check;
ALTER TABLE workspace_operations ADD CONSTRAINT workspace_operations_phase_check CHECK (phase IN ('source_prepare', 'realize',
    'setup', 'upload', 'download', 'finalize', 'service_start', 'service_stop', 'cleanup', 'teardown', 'egress'));

-- A run's own finalize outcome (its work brought home, or why not), beside its command's status:
-- a run whose command succeeded but whose work could not be committed is not a plain success.
ALTER TABLE runs ADD COLUMN finalize_state text NOT NULL DEFAULT 'none'
    CHECK (finalize_state IN ('none', 'pending', 'settled', 'failed'));
ALTER TABLE runs ADD COLUMN finalize_error text NOT NULL DEFAULT '';
