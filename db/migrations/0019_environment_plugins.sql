-- Environment plugins (DESIGN §16): an environment's driver may be 'plugin' (an executable under
-- BERTH_PLUGIN_DIR pinned by its sha256 in the config). Image versions may come from an OCI image
-- (berth image import): source records where one came from ('' for terminal-built versions).
ALTER TABLE environments DROP CONSTRAINT environments_driver_check;
ALTER TABLE environments ADD CONSTRAINT environments_driver_check
    CHECK (driver IN ('local', 'ssh', 'sandbox', 'plugin'));

ALTER TABLE image_versions ADD COLUMN source text NOT NULL DEFAULT ''
    CHECK (length(source) <= 1024);
