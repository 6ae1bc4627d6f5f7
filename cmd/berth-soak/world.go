package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/environment"
)

// soak is one soak's state.
type soak struct {
	opts          options
	root          string
	addr, base    string
	http          http.Client
	serve, worker *proc
	pool          *pgxpool.Pool
	token         string
	company       string
	tasks         []task
	rng           *rand.Rand

	runs      map[string]*runRecord
	order     []string
	statuses  map[int]int // HTTP status → count, of the soak's API calls
	conflicts int         // 409 run_in_progress
	cancels   int
	closes    int
	reopen    map[string]reopening // task id → its closing workspace, until the task is reopened
	// closeRefusals counts refused closes; lastRefusal is the body of the last 4xx answer.
	closeRefusals int
	lastRefusal   string
	workerKills   []time.Time
	pgKills       []time.Time
	pgDown        time.Duration // the longest outage after a postmaster SIGKILL
	pgNotBack     int
}

// reopening is a task marked done for its workspace's close, to be reopened afterwards.
type reopening struct {
	workspace string
	since     time.Time
}

// kind is what a task's command does, and so how its runs must end.
type kind struct {
	name     string
	command  string
	status   string
	errCode  string
	exit     int
	lastLine string
}

var kinds = []kind{
	{"ok", "echo start; echo ok-last", db.RunSucceeded, "", 0, "ok-last"},
	{"fail", "echo start; echo fail-last; exit 7", db.RunFailed, "command_failed", 7, "fail-last"},
	{"sleep", "echo start; sleep 6; echo sleep-last", db.RunSucceeded, "", 0, "sleep-last"},
}

type task struct {
	id       string
	kind     kind
	isolated bool
}

// runRecord is what the soak knows of a run it created.
type runRecord struct {
	id              string
	task            task
	created         time.Time
	cancelRequested bool
}

// setup creates, directly in the database (as an operator's scripts could through the API), a
// company with a board member and its API token, a local environment, and two projects on git
// repositories, one isolated (a worktree per task) and one shared, each with tasks of every kind.
func (s *soak) setup(ctx context.Context) error {
	conn := fmt.Sprintf("host=%s port=5432 user=berth dbname=berth sslmode=disable", filepath.Join(s.dataDir(), "pg", "run"))
	pool, err := db.Open(ctx, conn)
	if err != nil {
		return err
	}
	s.pool = pool
	co, err := db.CreateCompany(ctx, pool, "Soak", "soak")
	if err != nil {
		return err
	}
	s.company = co.ID
	u, err := db.CreateUser(ctx, pool, "board@soak.example", "x", false)
	if err != nil {
		return err
	}
	if _, err := db.AddMember(ctx, pool, co.ID, u.ID, db.RoleBoard); err != nil {
		return err
	}
	tok, hash, err := db.NewToken()
	if err != nil {
		return err
	}
	if _, err := db.CreateUserToken(ctx, pool, u.ID, "soak", hash); err != nil {
		return err
	}
	s.token = tok
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		return err
	}
	env, err := db.CreateEnvironment(ctx, pool, db.NewEnvironment{ID: "5e0a0000-0000-4000-8000-000000000001",
		CompanyID: co.ID, Name: "local", Driver: "local", Config: doc})
	if err != nil {
		return err
	}
	for i, mode := range []string{"isolated", "shared"} {
		repo, err := s.gitRepo(mode)
		if err != nil {
			return err
		}
		p, err := db.CreateProject(ctx, pool, co.ID, db.ProjectFields{Name: "P " + mode, Key: fmt.Sprintf("P%d", i),
			Policy: db.ExecutionPolicy{DefaultMode: mode, EnvironmentID: env.ID, Strategy: "git_worktree", BranchTemplate: "soak/{task_key}"}})
		if err != nil {
			return err
		}
		pw, err := db.CreateProjectWorkspace(ctx, pool, co.ID, p.ID, db.ProjectWorkspaceFields{Name: "main",
			SourceType: "git", Source: repo, DefaultRef: "main"})
		if err != nil {
			return err
		}
		if _, err := db.SetPrimaryProjectWorkspace(ctx, pool, co.ID, p.ID, pw.ID); err != nil {
			return err
		}
		perKind := 2
		if mode == "shared" {
			perKind = 1
		}
		for _, k := range kinds {
			for n := range perKind {
				t, err := db.CreateTask(ctx, pool, co.ID, p.ID, u.ID, db.TaskFields{Title: fmt.Sprintf("%s %s %d", mode, k.name, n),
					Command: k.command, Trust: "standard", WorkspaceMode: "inherit"})
				if err != nil {
					return err
				}
				s.tasks = append(s.tasks, task{id: t.ID, kind: k, isolated: mode == "isolated"})
			}
		}
	}
	return nil
}

// gitRepo makes a one-commit repository under the soak's root.
func (s *soak) gitRepo(name string) (string, error) {
	repo := filepath.Join(s.root, "repo-"+name)
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(repo, "README.md"), []byte("soak\n"), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{{"init", "-q", "--initial-branch=main"}, {"add", "-A"},
		{"-c", "user.name=Soak", "-c", "user.email=soak@example.com", "commit", "-qm", "init"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %v: %v %s", args, err, out)
		}
	}
	return repo, nil
}
