-- Attempt selection as a job (DESIGN §13, docs/attempts.md): the request records the decision
-- (status, generation, the chosen attempt) and enqueues select_attempts; the job moves the git
-- refs under the source's preparation lock (the task branch, the rescue refs), re-signs the
-- discarded receipts and closes the discarded workspaces. refs_state says where that is:
-- pending until the job did it, done after (and for every group decided before this migration,
-- whose refs the request moved), failed when the job gave up (refs_error says why). head is the
-- commit the task branch was pointed at.
ALTER TABLE attempt_groups
    ADD COLUMN refs_state text NOT NULL DEFAULT 'done' CHECK (refs_state IN ('pending', 'done', 'failed')),
    ADD COLUMN refs_error text NOT NULL DEFAULT '',
    ADD COLUMN head text NOT NULL DEFAULT '';

-- Attempt groups notify "attempts" (the task's attempts panel and compare page follow the job).
CREATE FUNCTION berth_attempt_groups_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM berth_notify(NEW.company_id, 'attempts', NEW.id, NEW.task_id, NULL, NULL, NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER attempt_groups_notify AFTER INSERT OR UPDATE ON attempt_groups FOR EACH ROW
    EXECUTE FUNCTION berth_attempt_groups_notify();
