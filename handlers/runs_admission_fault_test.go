package handlers

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestRunAdmissionFailsAfterInsertTx (fault F3): a real error raised by PostgreSQL after River's
// InsertTx in the run admission transaction (a trigger refuses the run.created audit event that
// follows the provision job's insert) rolls everything back: the API answers a bare 5xx, and
// there is no run row and no job, although a sequence bumped by the job insert proves the insert
// happened inside the transaction. Without the fault the same request leaves both.
func TestRunAdmissionFailsAfterInsertTx(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE SEQUENCE f3_job_inserts`,
		`CREATE FUNCTION f3_count_job() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM nextval('f3_job_inserts'); RETURN NEW; END $$`,
		`CREATE TRIGGER f3_count_job AFTER INSERT ON river_job FOR EACH ROW
			WHEN (NEW.kind = 'provision') EXECUTE FUNCTION f3_count_job()`,
		`CREATE FUNCTION f3_fail() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'f3 injected failure after InsertTx'; END $$`,
		`CREATE TRIGGER f3_fail BEFORE INSERT ON audit_events FOR EACH ROW
			WHEN (NEW.action = 'run.created') EXECUTE FUNCTION f3_fail()`,
	} {
		if _, err := re.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	task := re.task("echo hi")
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := re.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const runs = `SELECT count(*) FROM runs WHERE task_id = $1`
	const jobs = `SELECT count(*) FROM river_job WHERE kind = 'provision'` // this database's only task

	code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil)
	if code < 500 || strings.Contains(strings.ToLower(fmt.Sprint(out)), "f3") {
		t.Fatalf("admission with a failure after InsertTx = %d %v, want a bare 5xx", code, out)
	}
	if n := count(runs, task.ID); n != 0 {
		t.Fatalf("%d run rows after the rolled-back admission, want 0", n)
	}
	if n := count(jobs); n != 0 {
		t.Fatalf("%d provision jobs after the rolled-back admission, want 0", n)
	}
	var inserted bool
	if err := re.pool.QueryRow(ctx, `SELECT is_called FROM f3_job_inserts`).Scan(&inserted); err != nil || !inserted {
		t.Fatalf("the provision job was never inserted (%v): the failure did not come after InsertTx", err)
	}

	if _, err := re.pool.Exec(ctx, `DROP TRIGGER f3_fail ON audit_events`); err != nil {
		t.Fatal(err)
	}
	id := re.start(task.ID, nil)
	if n := count(runs, task.ID); n != 1 {
		t.Fatalf("%d run rows after a committed admission, want 1", n)
	}
	if n := count(`SELECT count(*) FROM river_job WHERE kind = 'provision' AND args->>'run_id' = $1`, id); n != 1 {
		t.Fatalf("%d provision jobs for the committed run, want 1", n)
	}
}
