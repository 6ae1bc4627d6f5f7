-- Attempts and receipts (DESIGN §13, docs/attempts.md): a signed receipt per finalized run, attempt
-- groups that fork one task into several isolated worktrees from one base commit, and sealed
-- workspaces (final tree digest recorded, no further runs or bindings).

-- A run's receipt: the exact signed JSON document served by GET /api/runs/{id}/receipt.
CREATE TABLE receipts (
    run_id      uuid PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    company_id  uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    document    bytea NOT NULL,
    disposition text NOT NULL CHECK (disposition IN ('committed', 'artifact', 'unchanged', 'discarded')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX receipts_company_idx ON receipts (company_id);

-- An attempt group: count runs of one task, each in its own worktree forked from base_commit.
-- status open: attempts running or sealed, awaiting a decision; selected / discarded: decided.
-- generation fences the decision (a second one is refused).
CREATE TABLE attempt_groups (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    company_id            uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    task_id               uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    status                text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'selected', 'discarded')),
    generation            bigint NOT NULL DEFAULT 1,
    count                 integer NOT NULL CHECK (count BETWEEN 2 AND 8),
    command               text NOT NULL,
    base_ref              text NOT NULL,
    base_commit           text NOT NULL,
    task_branch           text NOT NULL,
    selected_workspace_id uuid REFERENCES execution_workspaces (id) ON DELETE SET NULL,
    selected_n            integer,
    replaced_ref          text NOT NULL DEFAULT '',
    created_by            uuid,
    created_at            timestamptz NOT NULL DEFAULT now(),
    decided_at            timestamptz,
    UNIQUE (company_id, id)
);
-- At most one undecided group per task.
CREATE UNIQUE INDEX attempt_groups_one_open_per_task ON attempt_groups (task_id) WHERE status = 'open';

-- An attempt is a normal run that belongs to a group, with its number and, once discarded, the
-- rescue ref its branch moved to.
ALTER TABLE runs ADD COLUMN attempt_group_id uuid REFERENCES attempt_groups (id) ON DELETE SET NULL,
    ADD COLUMN attempt_n integer CHECK (attempt_n BETWEEN 1 AND 8),
    ADD COLUMN attempt_rescue_ref text NOT NULL DEFAULT '',
    ADD CONSTRAINT runs_attempt_numbered CHECK (attempt_group_id IS NULL OR attempt_n IS NOT NULL);
CREATE UNIQUE INDEX runs_attempt_n ON runs (attempt_group_id, attempt_n) WHERE attempt_group_id IS NOT NULL;

-- One live run per task still holds for ordinary runs; the runs of an attempt group are live
-- together and count as one (their group: attempt_groups_one_open_per_task, and admission checks
-- under the task's row lock).
DROP INDEX runs_one_live_per_task;
CREATE UNIQUE INDEX runs_one_live_per_task ON runs (task_id)
    WHERE status IN ('queued', 'preparing', 'running') AND attempt_group_id IS NULL;

-- A sealed workspace: its final tree digest is recorded and it takes no further runs or bindings.
ALTER TABLE execution_workspaces ADD COLUMN sealed_at timestamptz,
    ADD COLUMN final_tree_digest text NOT NULL DEFAULT '';
