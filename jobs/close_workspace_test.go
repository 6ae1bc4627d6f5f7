package jobs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/db/dbtest"
	"berth/jobs/internal/jobstest"
	"berth/workspace"
)

// closeFixture is a database with a company and a project, and a Manager on a private data dir.
type closeFixture struct {
	t       *testing.T
	w       *CloseWorkspaceWorker
	company string
	project string
}

func newCloseFixture(t *testing.T) closeFixture {
	t.Helper()
	pool := dbtest.New(t)
	mgr, err := workspace.NewManager(t.TempDir(), workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	company := jobstest.Company(t, pool)
	project := jobstest.Project(t, pool, company, db.ExecutionPolicy{DefaultMode: "isolated", Strategy: "copy",
		BranchTemplate: "berth/{task_key}"})
	d := Deps{Pool: pool, Log: jobstest.Log(), Workspaces: mgr, NodeID: "test"}
	return closeFixture{t: t, w: &CloseWorkspaceWorker{runWorker: runWorker{deps: d}}, company: company, project: project}
}

// closing records a copy workspace with ref that is being closed at generation 2.
func (f closeFixture) closing(ref string) db.ExecutionWorkspace {
	f.t.Helper()
	ctx := context.Background()
	ws, err := db.CreateExecutionWorkspace(ctx, f.w.deps.Pool, db.NewExecutionWorkspace{CompanyID: f.company, ProjectID: f.project,
		Mode: "isolated", Strategy: "copy", Trust: "standard", Ref: ref})
	if err != nil {
		f.t.Fatal(err)
	}
	if ws, err = db.MarkExecutionWorkspaceReady(ctx, f.w.deps.Pool, ws.ID, ws.Generation, db.Realized{Cwd: ref}); err != nil {
		f.t.Fatal(err)
	}
	if ws, err = db.BeginWorkspaceClose(ctx, f.w.deps.Pool, ws.ID, ws.Generation); err != nil {
		f.t.Fatal(err)
	}
	return ws
}

func (f closeFixture) work(args CloseWorkspaceArgs) db.ExecutionWorkspace {
	f.t.Helper()
	ctx := context.Background()
	job := &river.Job[CloseWorkspaceArgs]{JobRow: &rivertype.JobRow{Attempt: 1, CreatedAt: time.Now().Add(-time.Second)}, Args: args}
	if err := f.w.Work(ctx, job); err != nil {
		f.t.Fatalf("close_workspace: %v", err)
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, f.w.deps.Pool, args.CompanyID, args.WorkspaceID)
	if err != nil {
		f.t.Fatal(err)
	}
	return ws
}

// TestCloseWorkspaceNeverDeletesUnmanaged: a directory under the managed base that Berth has no
// ownership record for is left alone; the close ends cleanup_failed with the reason and no host
// path. A stale generation changes nothing; a managed copy is removed.
func TestCloseWorkspaceNeverDeletesUnmanaged(t *testing.T) {
	t.Parallel()
	f := newCloseFixture(t)
	mgr := f.w.deps.Workspaces

	// A directory named like a workspace that Berth did not create.
	ref := "ws-0123456789abcdef0123456789abcdef"
	foreign := filepath.Join(mgr.Base(), ref)
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, "keep.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := f.closing(ref)

	// A job of an older generation is fenced out.
	if got := f.work(CloseWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws.ID, Generation: ws.Generation - 1, Remove: true}); got.Status != "closing" {
		t.Fatalf("stale job changed the workspace: %s", got.Status)
	}
	got := f.work(CloseWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws.ID, Generation: ws.Generation, Remove: true})
	if got.Status != "cleanup_failed" || !strings.Contains(got.CleanupReason, "does not manage") || strings.Contains(got.CleanupReason, mgr.Base()) {
		t.Fatalf("unmanaged close: %s %q", got.Status, got.CleanupReason)
	}
	if b, err := os.ReadFile(filepath.Join(foreign, "keep.txt")); err != nil || string(b) != "mine" {
		t.Fatalf("the unmanaged directory was touched: %q %v", b, err)
	}
	var status string
	_ = f.w.deps.Pool.QueryRow(context.Background(), `SELECT status FROM workspace_operations
		WHERE execution_workspace_id = $1 AND phase = 'teardown'`, ws.ID).Scan(&status)
	if status != "failed" {
		t.Fatalf("teardown operation = %q, want failed", status)
	}

	// A copy Berth made is removed.
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := mgr.RealizeCopy(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := mgr.Root(res.Ref)
	ws = f.closing(res.Ref)
	if got := f.work(CloseWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws.ID, Generation: ws.Generation, Remove: true}); got.Status != "closed" || got.ClosedAt == nil {
		t.Fatalf("managed copy close: %s %q", got.Status, got.CleanupReason)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("the copy is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(src, "a.txt")); err != nil {
		t.Fatalf("the copy's source was touched: %v", err)
	}

	// A retry after an attempt that removed the root (record included) but died before recording
	// the close adopts the removal; without that earlier attempt, a root that is not here is not
	// assumed removed (it may live on another node).
	ctx := context.Background()
	for _, retried := range []bool{true, false} {
		res, err := mgr.RealizeCopy(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		ws := f.closing(res.Ref)
		if err := mgr.Destroy(ctx, res.Ref); err != nil {
			t.Fatal(err)
		}
		if retried {
			if _, err := db.StartOperation(ctx, f.w.deps.Pool, db.NewOperation{CompanyID: f.company, ExecutionWorkspaceID: ws.ID,
				Phase: "teardown", Command: "rm -rf"}); err != nil {
				t.Fatal(err)
			}
		}
		got := f.work(CloseWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws.ID, Generation: ws.Generation, Remove: true})
		if want := map[bool]string{true: "closed", false: "cleanup_failed"}[retried]; got.Status != want {
			t.Fatalf("retried=%v: %s %q, want %s", retried, got.Status, got.CleanupReason, want)
		}
	}
}
