-- Runtime services on plugin environments (docs/plugins.md "Services and terminals"): a service
-- of a plugin environment runs on an instance of its own that the plugin holds; provider_ref
-- records it ('plugin:<ref>', '' for services this node's supervisor runs in a jail) so a stop,
-- a restart or the sweep after a crash of Berth releases it. Its port is the one the plugin
-- published on this host's loopback.
ALTER TABLE runtime_services ADD COLUMN provider_ref text NOT NULL DEFAULT ''
    CHECK (length(provider_ref) <= 600);

-- A setup session of a plugin environment is a terminal on an instance the plugin holds for it
-- (no scratch layer on this host): provider_ref records it so cancel, finish and expiry release it.
ALTER TABLE image_setup_sessions ADD COLUMN provider_ref text NOT NULL DEFAULT ''
    CHECK (length(provider_ref) <= 600);
