package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/workspace"
)

// TestCrashMidAttempts: the worker dies while an attempt group runs, one attempt finished and two
// still running. After the restart every attempt is finished or orphaned, each workspace is
// sealed by its finalize (with a receipt), and the group is selectable.
func TestCrashMidAttempts(t *testing.T) {
	t.Parallel()
	w := newCrashWorld(t, "")
	ctx := context.Background()
	task, err := db.CreateTask(ctx, w.pool, w.company, w.project, w.user, db.TaskFields{Title: "T", Command: "true",
		Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		t.Fatal(err)
	}
	var groupID string
	runs := make([]string, 3)
	err = db.InTx(ctx, w.pool, func(tx pgx.Tx) error {
		snap, err := db.LoadPlanSnapshot(ctx, tx, w.company, task.ID)
		if err != nil {
			return err
		}
		plan := workspace.ResolvePlan(crashPlanInput(snap))
		pw, err := db.PrimaryProjectWorkspace(ctx, tx, w.company, w.project)
		if err != nil {
			return err
		}
		head, err := exec.Command("git", "-C", pw.Source, "rev-parse", "main").Output()
		if err != nil {
			return err
		}
		out := strings.TrimSpace(string(head))
		g, err := db.CreateAttemptGroup(ctx, tx, db.NewAttemptGroup{CompanyID: w.company, TaskID: task.ID, Count: 3,
			Command: "true", BaseRef: "refs/heads/main", BaseCommit: out, TaskBranch: plan.Branch, CreatedBy: w.user})
		if err != nil {
			return err
		}
		groupID = g.ID
		for n := 1; n <= 3; n++ {
			p := plan
			p.Branch = plan.Branch + "-a" + string(rune('0'+n))
			b, _ := json.Marshal(p)
			cmd := `echo started >> "marker-$BERTH_RUN_ID"; sleep 300` // a2, a3: running at the crash
			if n == 1 {
				cmd = `echo one > one.txt`
			}
			r, err := db.CreateAttemptRun(ctx, tx, db.NewRun{CompanyID: w.company, TaskID: task.ID, EnvironmentID: p.EnvironmentID,
				CreatedBy: w.user, Command: cmd, Plan: b, TimeoutS: 3600}, g.ID, n)
			if err != nil {
				return err
			}
			runs[n-1] = r.ID
			if _, err := w.ins.InsertTx(ctx, tx, jobs.ProvisionArgs{RunID: r.ID}, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	group := func() (string, []db.AttemptItem) {
		g, err := db.LatestAttemptGroup(ctx, w.pool, w.company, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		items, err := db.AttemptItems(ctx, w.pool, w.company, groupID)
		if err != nil {
			t.Fatal(err)
		}
		return db.AttemptGroupState(g, items), items
	}

	first := w.startWorker()
	w.waitFor("a1 sealed and a2, a3 running", 2*time.Minute, func() bool {
		_, items := group()
		return items[0].Sealed && items[1].RunStatus == db.RunRunning && items[2].RunStatus == db.RunRunning
	})
	w.crash(first)
	crashedAt := time.Now()
	if state, _ := group(); state != "running" {
		t.Fatalf("group after the crash = %s, want running", state)
	}
	w.startWorker()
	restartedAt := time.Now()
	for _, id := range runs[1:] {
		w.recovered(id, crashedAt, restartedAt)
	}
	var items []db.AttemptItem
	w.waitFor("the group to become selectable", time.Minute, func() bool {
		var state string
		state, items = group()
		return state == "sealed"
	})
	if items[0].RunStatus != db.RunSucceeded {
		t.Fatalf("a1 = %+v", items[0])
	}
	for _, it := range items {
		if !it.Sealed || it.FinalTreeDigest == "" {
			t.Fatalf("attempt %d not sealed: %+v", it.N, it)
		}
		if it.N > 1 && (it.RunStatus != db.RunFailed || it.ErrorCode != "orphaned") {
			t.Fatalf("attempt %d = %s/%s, want failed/orphaned", it.N, it.RunStatus, it.ErrorCode)
		}
		if _, err := db.ReceiptOf(ctx, w.pool, w.company, it.RunID); err != nil {
			t.Fatalf("attempt %d has no receipt: %v", it.N, err)
		}
	}
	if items[0].FinalTreeDigest == items[1].FinalTreeDigest {
		t.Fatal("a1's digest equals a2's: a1's file is not in it")
	}
}
