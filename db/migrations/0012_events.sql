-- Live pages (docs/live.md, DESIGN §12): every state change a page shows sends NOTIFY berth_events
-- in the transaction that makes it, so a listener sees it exactly when it commits (a rolled-back
-- change sends nothing). The payload is a small JSON object
--   {"company_id", "topic", "id", "task_id", "workspace_id", "run_id", "environment_id"}
-- (null members left out): topic names what changed, id is the object that changed, the others
-- say where it belongs so web nodes can route it to the pages that show it. Nothing secret and
-- no paths: ids only. PostgreSQL folds identical notifications of one transaction into one, so a
-- statement touching a row twice, or the same object in one transaction, notifies once.
--
-- Updates that change nothing a page shows (heartbeats, a preview's last request time) do not
-- notify: each trigger's WHEN lists the columns that matter.

CREATE FUNCTION berth_notify(company uuid, topic text, id uuid, task uuid, ws uuid, run uuid, env uuid)
RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('berth_events', json_strip_nulls(json_build_object(
        'company_id', company, 'topic', topic, 'id', id, 'task_id', task,
        'workspace_id', ws, 'run_id', run, 'environment_id', env))::text);
$$;

-- Runs: "run" for a change of state, "run_log" when only the log grew (≤ 2 a second per run:
-- the executor writes the log every 500 ms).
CREATE FUNCTION berth_runs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    topic text := 'run';
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.status, OLD.error_code, OLD.exit_code, OLD.cancel_requested,
            OLD.execution_workspace_id, OLD.lease_id, OLD.started_at, OLD.finished_at)
        IS NOT DISTINCT FROM (NEW.status, NEW.error_code, NEW.exit_code, NEW.cancel_requested,
            NEW.execution_workspace_id, NEW.lease_id, NEW.started_at, NEW.finished_at) THEN
        topic := 'run_log';
    END IF;
    PERFORM berth_notify(NEW.company_id, topic, NEW.id, NEW.task_id, NEW.execution_workspace_id, NEW.id, NEW.environment_id);
    IF TG_OP = 'UPDATE' AND NEW.lease_id IS NOT NULL AND OLD.lease_id IS DISTINCT FROM NEW.lease_id THEN
        -- the lease just acquired for the run (its INSERT does not notify: see leases below)
        PERFORM berth_notify(NEW.company_id, 'lease', NEW.lease_id, NEW.task_id, NEW.execution_workspace_id, NEW.id, NEW.environment_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER runs_notify_insert AFTER INSERT ON runs FOR EACH ROW EXECUTE FUNCTION berth_runs_notify();
CREATE TRIGGER runs_notify_update AFTER UPDATE ON runs FOR EACH ROW
    WHEN ((OLD.status, OLD.error_code, OLD.exit_code, OLD.cancel_requested, OLD.execution_workspace_id,
            OLD.lease_id, OLD.started_at, OLD.finished_at, OLD.log_bytes, OLD.log_truncated)
        IS DISTINCT FROM (NEW.status, NEW.error_code, NEW.exit_code, NEW.cancel_requested, NEW.execution_workspace_id,
            NEW.lease_id, NEW.started_at, NEW.finished_at, NEW.log_bytes, NEW.log_truncated))
    EXECUTE FUNCTION berth_runs_notify();

-- The operations ledger: a step written running, and settled.
CREATE FUNCTION berth_operations_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'operation', NEW.id, NEW.task_id, NEW.execution_workspace_id, NEW.run_id, NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER workspace_operations_notify AFTER INSERT OR UPDATE ON workspace_operations FOR EACH ROW
    EXECUTE FUNCTION berth_operations_notify();

-- Leases. NOTIFY serializes the commits that send it (PostgreSQL takes one lock for all of them
-- until commit ends), and a lease's acquire and its holder's release are the hot path every run
-- of every company crosses (migration 0004): those two stay silent and are announced by the
-- statement that follows each of them anyway, which notifies in its own transaction: the run's
-- lease_id update after an acquire (the run trigger sends a "lease" event for it too) and the
-- cleanup mark after a release (finalize). Everything else a lease page shows notifies: expiry,
-- takeover and force release (generation), failure, cleanup marks and retries; not heartbeats.
CREATE FUNCTION berth_leases_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'lease', NEW.id, NEW.task_id, NEW.execution_workspace_id, NEW.run_id, NEW.environment_id);
    RETURN NULL;
END $$;
CREATE TRIGGER environment_leases_notify_update AFTER UPDATE ON environment_leases FOR EACH ROW
    WHEN (OLD.generation <> NEW.generation OR OLD.cleanup_attempts <> NEW.cleanup_attempts
        OR (OLD.cleanup_status <> NEW.cleanup_status AND OLD.cleanup_status <> 'none')
        OR (OLD.status <> NEW.status AND NEW.status <> 'released')
        OR (OLD.run_id, OLD.task_id) IS DISTINCT FROM (NEW.run_id, NEW.task_id))
    EXECUTE FUNCTION berth_leases_notify();

-- Runtime services: state, health and what the panel shows of them; not last_request_at (the
-- preview proxy writes it on every proxied request).
CREATE FUNCTION berth_services_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'service', NEW.id, NULL, NEW.execution_workspace_id, NEW.run_id, NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER runtime_services_notify_insert AFTER INSERT ON runtime_services FOR EACH ROW
    EXECUTE FUNCTION berth_services_notify();
CREATE TRIGGER runtime_services_notify_update AFTER UPDATE ON runtime_services FOR EACH ROW
    WHEN ((OLD.status, OLD.health, OLD.desired_state, OLD.port, OLD.generation, OLD.restarts, OLD.exit_code,
            OLD.stop_reason, OLD.log_excerpt, OLD.started_at, OLD.stopped_at)
        IS DISTINCT FROM (NEW.status, NEW.health, NEW.desired_state, NEW.port, NEW.generation, NEW.restarts,
            NEW.exit_code, NEW.stop_reason, NEW.log_excerpt, NEW.started_at, NEW.stopped_at))
    EXECUTE FUNCTION berth_services_notify();

-- Execution workspaces: status, finalize state and git facts (close-readiness reads them).
CREATE FUNCTION berth_workspaces_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'workspace', NEW.id, NEW.source_task_id, NEW.id, NULL, NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER execution_workspaces_notify_insert AFTER INSERT ON execution_workspaces FOR EACH ROW
    EXECUTE FUNCTION berth_workspaces_notify();
CREATE TRIGGER execution_workspaces_notify_update AFTER UPDATE ON execution_workspaces FOR EACH ROW
    WHEN ((OLD.status, OLD.finalize_state, OLD.generation, OLD.branch, OLD.base_commit, OLD.closed_at,
            OLD.cleanup_reason, OLD.reusable)
        IS DISTINCT FROM (NEW.status, NEW.finalize_state, NEW.generation, NEW.branch, NEW.base_commit, NEW.closed_at,
            NEW.cleanup_reason, NEW.reusable))
    EXECUTE FUNCTION berth_workspaces_notify();

-- A task's workspace binding: the task page's binding panel and the close-readiness of the
-- workspace it binds (and of the one it no longer binds).
CREATE FUNCTION berth_bindings_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE'
            OR OLD.execution_workspace_id IS DISTINCT FROM NEW.execution_workspace_id) THEN
        PERFORM berth_notify(OLD.company_id, 'binding', OLD.task_id, OLD.task_id, OLD.execution_workspace_id, NULL, NULL);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM berth_notify(NEW.company_id, 'binding', NEW.task_id, NEW.task_id, NEW.execution_workspace_id, NULL, NULL);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER task_workspace_bindings_notify AFTER INSERT OR UPDATE OR DELETE ON task_workspace_bindings
    FOR EACH ROW EXECUTE FUNCTION berth_bindings_notify();

-- Tasks: their fields and status (the task page, close-readiness's open tasks).
CREATE FUNCTION berth_tasks_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'task', NEW.id, NEW.id, NULL, NULL, NEW.environment_id);
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_notify AFTER INSERT OR UPDATE ON tasks FOR EACH ROW EXECUTE FUNCTION berth_tasks_notify();

-- Work products a finalize records (the task page, the workspace page).
CREATE FUNCTION berth_work_products_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'work_product', NEW.id, NEW.task_id, NEW.execution_workspace_id, NEW.run_id, NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER work_products_notify AFTER INSERT ON work_products FOR EACH ROW EXECUTE FUNCTION berth_work_products_notify();

-- Image setup sessions (the session page, the environment page's images card).
CREATE FUNCTION berth_setup_sessions_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'setup_session', NEW.id, NULL, NULL, NULL, NEW.environment_id);
    RETURN NULL;
END $$;
CREATE TRIGGER image_setup_sessions_notify AFTER INSERT OR UPDATE ON image_setup_sessions FOR EACH ROW
    EXECUTE FUNCTION berth_setup_sessions_notify();

-- Environments and their image versions: status, qualification (a probe), the active version.
CREATE FUNCTION berth_environments_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'environment', NEW.id, NULL, NULL, NULL, NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER environments_notify AFTER INSERT OR UPDATE ON environments FOR EACH ROW
    EXECUTE FUNCTION berth_environments_notify();

CREATE FUNCTION berth_image_versions_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'environment', NEW.environment_id, NULL, NULL, NULL, NEW.environment_id);
    RETURN NULL;
END $$;
CREATE TRIGGER image_versions_notify AFTER INSERT OR UPDATE ON image_versions FOR EACH ROW
    EXECUTE FUNCTION berth_image_versions_notify();
