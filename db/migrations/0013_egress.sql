-- Egress by policy (DESIGN §15, docs/network.md): what a run reached and what was refused, kept
-- with the run for its page; a refused connection is also a step of the workspace's ledger.
ALTER TABLE runs ADD COLUMN egress jsonb;

ALTER TABLE workspace_operations DROP CONSTRAINT workspace_operations_phase_check;
ALTER TABLE workspace_operations ADD CONSTRAINT workspace_operations_phase_check CHECK (phase IN ('source_prepare', 'realize',
    'setup', 'upload', 'download', 'finalize', 'service_start', 'service_stop', 'cleanup', 'teardown', 'egress'));
