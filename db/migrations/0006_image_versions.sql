-- Image versions: the numbered filesystem layers a sandbox environment mounts at /opt/image
-- (docs/api.md, "Environments"). Exactly one version of an environment is active at a time; rollback activates an
-- earlier available one. A version's digest is the capsule tree digest of its layer
-- (workspace.Manifest.Digest), empty only while it is building or after it failed.

CREATE TABLE image_versions (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id         uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    environment_id     uuid NOT NULL,
    number             integer NOT NULL CHECK (number >= 1),
    digest             text NOT NULL DEFAULT '' CHECK (digest = '' OR digest ~ '^sha256:[0-9a-f]{64}$'),
    size               bigint NOT NULL DEFAULT 0 CHECK (size >= 0),
    status             text NOT NULL CHECK (status IN ('building', 'available', 'active', 'failed', 'revoked')),
    -- The setup session that captured the layer (image_setup_sessions arrive later: no foreign key yet).
    created_by_session uuid,
    created_by         uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (company_id, environment_id) REFERENCES environments (company_id, id) ON DELETE CASCADE,
    CHECK (digest <> '' OR status IN ('building', 'failed')),
    UNIQUE (environment_id, number),
    UNIQUE (company_id, id)
);

-- Exactly one active version per environment.
CREATE UNIQUE INDEX image_versions_one_active_idx ON image_versions (environment_id) WHERE status = 'active';

-- Sandbox environments made before this migration get what creating one now gives: version 1, the
-- empty layer, active. Its digest is the tree digest of an empty manifest, sha256("berth-tree-v1\n").
INSERT INTO image_versions (company_id, environment_id, number, digest, size, status)
SELECT e.company_id, e.id, 1, 'sha256:' || encode(sha256(convert_to(E'berth-tree-v1\n', 'UTF8')), 'hex'), 0, 'active'
FROM environments e
WHERE e.driver = 'sandbox'
  AND NOT EXISTS (SELECT 1 FROM image_versions v WHERE v.environment_id = e.id);

-- Their active image changed (from none to version 1), and a qualification holds only for the image
-- it was earned with.
UPDATE environments SET qualification = NULL WHERE driver = 'sandbox' AND qualification IS NOT NULL;
