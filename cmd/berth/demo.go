package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/environment"
)

// demoRepoFiles is the small project `make run` gives a newcomer to work on.
var demoRepoFiles = map[string]string{
	"README.md": "# Demo\n\nA tiny project Berth created so you can try a run.\n",
	"hello.sh":  "#!/bin/sh\necho \"hello from ${BERTH_TASK_ID:-a shell}\"\n",
}

// seedDemo gives a fresh install (no companies yet) something to click: a demo company with every
// instance admin as a board member, a local environment, a project whose primary workspace is a
// small git repository created under the data dir, and one task. Later starts change nothing.
func seedDemo(ctx context.Context, pool *pgxpool.Pool, dataDir string) error {
	var fresh bool
	if err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM companies)`).Scan(&fresh); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if !fresh {
		return nil
	}
	repo := filepath.Join(dataDir, "demo", "repo")
	if err := makeDemoRepo(ctx, repo); err != nil {
		return err
	}
	return db.InTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(bootstrapLockKey)); err != nil {
			return fmt.Errorf("demo: lock: %w", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM companies)`).Scan(&exists); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if exists { // another process seeded first
			return nil
		}
		return seedDemoRows(ctx, tx, repo)
	})
}

// seedDemoRows writes the demo company and its objects inside tx.
func seedDemoRows(ctx context.Context, tx pgx.Tx, repo string) error {
	co, err := db.CreateCompany(ctx, tx, "Demo Company", "demo")
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO memberships (company_id, user_id, role)
		SELECT $1, id, 'board' FROM users WHERE is_instance_admin ON CONFLICT DO NOTHING`, co.ID); err != nil {
		return fmt.Errorf("demo: members: %w", err)
	}
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		return err
	}
	env, err := db.CreateEnvironment(ctx, tx, db.NewEnvironment{ID: newUUID(), CompanyID: co.ID, Name: "local", Driver: "local", Config: doc})
	if err != nil {
		return err
	}
	p, err := db.CreateProject(ctx, tx, co.ID, db.ProjectFields{Name: "Demo", Key: "DEMO",
		Description: "A small git repository Berth created for you to try runs on.",
		Policy: db.ExecutionPolicy{DefaultMode: "isolated", AllowTaskOverride: true, EnvironmentID: env.ID,
			Strategy: "git_worktree", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		return err
	}
	ws, err := db.CreateProjectWorkspace(ctx, tx, co.ID, p.ID, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "git", Source: repo, DefaultRef: "main"})
	if err != nil {
		return err
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, tx, co.ID, p.ID, ws.ID); err != nil {
		return err
	}
	task, err := db.CreateTask(ctx, tx, co.ID, p.ID, "", db.TaskFields{Title: "Say hello",
		Description: "Runs the demo script in an isolated worktree of the demo repository.",
		Command:     "sh hello.sh", Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		return err
	}
	for _, ev := range []struct{ action, typ, id string }{
		{"company.created", "company", co.ID}, {"environment.created", "environment", env.ID},
		{"project.created", "project", p.ID}, {"project_workspace.created", "project_workspace", ws.ID},
		{"task.created", "task", task.ID},
	} {
		if err := db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: co.ID, ActorType: db.ActorSystem, ActorLabel: "demo seed",
			Action: ev.action, TargetType: ev.typ, TargetID: ev.id}); err != nil {
			return err
		}
	}
	return nil
}

// makeDemoRepo creates the demo git repository with one commit on main, unless it exists.
func makeDemoRepo(ctx context.Context, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("demo repo: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo repo: %w", err)
	}
	for name, body := range demoRepoFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("demo repo: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"init", "--quiet", "--initial-branch=main"},
		{"add", "-A"},
		{"-c", "user.name=Berth", "-c", "user.email=berth@localhost", "commit", "--quiet", "-m", "Demo project"},
	} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("demo repo: git %s: %v: %s", args[0], err, out)
		}
	}
	return nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
