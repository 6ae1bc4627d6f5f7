-- The lease hot path. Every run writes environment_leases at least twice (acquire, release) from
-- whichever worker holds it, so each statement's fixed cost is paid by every run of every company.
-- Profiling the acquire + release cycle (8 workers, perf on the backends) showed most of it was
-- not the work itself but checks the acquiring statement already makes:
--
-- * five foreign-key triggers per insert, each an SPI query that KEY SHARE locks its parent row,
--   and the parents are the hottest rows there are (every lease of a company locks the company
--   row, every lease of an environment its environment row), so the locks pile up as multixacts;
-- * two CHECK constraints, whose expressions PostgreSQL parses again for every statement;
-- * a partial index on environment_id that duplicates the leading column of the one-live index.
--
-- AcquireLease joins the environment and the workspace by company under FOR SHARE in the same
-- statement that inserts (as before: that lock interlocks with archiving and closing), which is a
-- stronger check than the foreign keys made (they never compared companies); task and run ids are
-- recorded as its one caller, the provision job, read them for the company. Berth never
-- hard-deletes companies, environments, workspaces, tasks or runs (they are archived, closed or
-- ended), so the ON DELETE actions had nothing to do. Statuses become enum types: the same closed
-- sets, checked by the type at no per-statement cost. docs/database.md has the figures.

DROP INDEX environment_leases_env_live_idx;
DROP INDEX environment_leases_one_live;

ALTER TABLE environment_leases
    DROP CONSTRAINT environment_leases_company_id_fkey,
    DROP CONSTRAINT environment_leases_environment_id_fkey,
    DROP CONSTRAINT environment_leases_execution_workspace_id_fkey,
    DROP CONSTRAINT environment_leases_task_id_fkey,
    DROP CONSTRAINT environment_leases_run_fk,
    DROP CONSTRAINT environment_leases_status_check,
    DROP CONSTRAINT environment_leases_cleanup_status_check;

CREATE TYPE lease_status AS ENUM ('acquiring', 'active', 'releasing', 'released', 'expired', 'failed');
CREATE TYPE lease_cleanup_status AS ENUM ('none', 'pending', 'succeeded', 'failed');

ALTER TABLE environment_leases
    ALTER COLUMN status DROP DEFAULT,
    ALTER COLUMN status TYPE lease_status USING status::lease_status,
    ALTER COLUMN status SET DEFAULT 'acquiring',
    ALTER COLUMN cleanup_status DROP DEFAULT,
    ALTER COLUMN cleanup_status TYPE lease_cleanup_status USING cleanup_status::lease_cleanup_status,
    ALTER COLUMN cleanup_status SET DEFAULT 'none';

-- One live lease per (environment, execution workspace): the database refuses a double grant. Its
-- leading column also serves "live leases of an environment" (archiving counts them).
CREATE UNIQUE INDEX environment_leases_one_live ON environment_leases (environment_id, execution_workspace_id)
    WHERE status IN ('acquiring', 'active', 'releasing');
