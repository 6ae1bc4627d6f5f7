package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment"
	"berth/environment/jail/jailtest"
)

// Scale-out end to end (DESIGN §11, docs/scaling.md): one `berth serve --workers=false` and two
// `berth worker` processes on one database, each with a data directory of its own, the workers
// with internal listeners.

// nodeCluster is the three processes and what the test needs to drive them.
type nodeCluster struct {
	t       testing.TB
	conn    string
	pool    *pgxpool.Pool
	base    string // the web node
	secret  string
	company string
	project string
	user    string
	token   string // a board member's API token
	admin   string // an instance admin's API token
	repo    string
	procs   map[string]*worker
	dirs    map[string]string // each node's data dir
}

// nodeTimingVars make dead-node takeover quick in tests (the defaults are DESIGN §11's).
var nodeTimingVars = map[string]string{"BERTH_NODE_HEARTBEAT": "500ms", "BERTH_NODE_DEAD_AFTER": "3s",
	"BERTH_NODE_TAKEOVER_EVERY": "1s"}

func newNodeCluster(t testing.TB) *nodeCluster {
	t.Helper()
	ctx := context.Background()
	c := &nodeCluster{t: t, conn: dbtest.ConnString(t), procs: map[string]*worker{}, dirs: map[string]string{}}
	var key [32]byte
	_, _ = rand.Read(key[:])
	c.secret = hex.EncodeToString(key[:])
	pool, err := db.Open(ctx, c.conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c.pool = pool
	t.Cleanup(c.dumpOnFailure)
	co, err := db.CreateCompany(ctx, pool, "Acme", "acme")
	if err != nil {
		t.Fatal(err)
	}
	c.company = co.ID
	u, err := db.CreateUser(ctx, pool, "board@example.com", "x", false)
	if err != nil {
		t.Fatal(err)
	}
	c.user = u.ID
	if _, err := db.AddMember(ctx, pool, co.ID, u.ID, db.RoleBoard); err != nil {
		t.Fatal(err)
	}
	c.token = c.newToken(u.ID)
	a, err := db.CreateUser(ctx, pool, "admin@example.com", "x", true)
	if err != nil {
		t.Fatal(err)
	}
	c.admin = c.newToken(a.ID)

	c.repo = jailtest.Dir(t)
	c.git("init", "-q", "--initial-branch=main")
	if err := os.WriteFile(filepath.Join(c.repo, "index.html"), []byte("served from a worker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.git("add", "-A")
	c.git("-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qm", "init")
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	env, err := db.CreateEnvironment(ctx, pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-00000000e0de",
		CompanyID: c.company, Name: "local", Driver: "local", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.CreateProject(ctx, pool, c.company, db.ProjectFields{Name: "P", Key: "PRJ", Policy: db.ExecutionPolicy{
		DefaultMode: "isolated", EnvironmentID: env.ID, Strategy: "git_worktree", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		t.Fatal(err)
	}
	c.project = p.ID
	web := db.ServiceDefinition{Name: "web", Command: `exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 30, StopPolicy: "manual", Lifecycle: "ephemeral"}
	pw, err := db.CreateProjectWorkspace(ctx, pool, c.company, p.ID, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "git", Source: c.repo, DefaultRef: "main", Services: []db.ServiceDefinition{web}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, pool, c.company, p.ID, pw.ID); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *nodeCluster) newToken(userID string) string {
	c.t.Helper()
	tok, hash, err := db.NewToken()
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := db.CreateUserToken(context.Background(), c.pool, userID, "test", hash); err != nil {
		c.t.Fatal(err)
	}
	return tok
}

func (c *nodeCluster) git(args ...string) string {
	c.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = c.repo
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("git %v: %v %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// start runs berth with args as node id, on the cluster's database with a data dir of its own.
func (c *nodeCluster) start(id string, extra map[string]string, args ...string) *worker {
	c.t.Helper()
	dir, ok := c.dirs[id] // a restarted node keeps its data dir
	if !ok {
		dir = jailtest.Dir(c.t)
		c.dirs[id] = dir
	}
	vars := map[string]string{"DATABASE_URL": c.conn, "BERTH_DATA_DIR": dir, "BERTH_NODE_ID": id,
		"BERTH_SECRET_KEY": c.secret, "BERTH_BASE_URL": c.base, "BERTH_LOG_LEVEL": "info"}
	for k, v := range nodeTimingVars {
		vars[k] = v
	}
	for k, v := range extra {
		vars[k] = v
	}
	cmd := exec.Command(os.Args[0], args...) // the test binary is berth (TestMain, BERTH_TEST_AS_MAIN)
	cmd.Env = append(os.Environ(), "BERTH_TEST_AS_MAIN=1")
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &worker{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.procs[id] = p
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if c.t.Failed() {
			c.t.Logf("node %s output:\n%s", id, p.out.String())
		}
	})
	return p
}

// stopAll stops every node (SIGTERM, then SIGKILL after 30 s) and waits for them.
func (c *nodeCluster) stopAll() {
	for _, p := range c.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range c.procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// api calls the web node with token and decodes a JSON answer into out (when not nil).
func (c *nodeCluster) api(method, path, token string, body any, out any) int {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

func (c *nodeCluster) task(command string) (id, key string) {
	c.t.Helper()
	task, err := db.CreateTask(context.Background(), c.pool, c.company, c.project, c.user, db.TaskFields{Title: "T",
		Command: command, Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		c.t.Fatal(err)
	}
	return task.ID, task.Key
}

// runOf admits a run of task through the web node and returns its id.
func (c *nodeCluster) runOf(task string) string {
	c.t.Helper()
	var out struct {
		ID string `json:"id"`
	}
	if code := c.api("POST", "/api/tasks/"+task+"/runs", c.token, nil, &out); code != http.StatusAccepted {
		c.t.Fatalf("start run of %s: %d", task, code)
	}
	runID := out.ID
	c.t.Cleanup(func() { _, _ = environment.KillTagged(context.Background(), runID, time.Second) })
	return runID
}

func (c *nodeCluster) run(id string) db.Run {
	c.t.Helper()
	return runRow(c.t, c.pool, id)
}

func (c *nodeCluster) count(sql string, args ...any) int {
	c.t.Helper()
	return countRows(c.t, c.pool, sql, args...)
}

func (c *nodeCluster) waitFor(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	waitUntil(c.t, what, within, cond)
}

// settled: the run ended and its workspace's finalize settled.
func (c *nodeCluster) settled(id string) bool {
	r := c.run(id)
	return !r.Live() && r.ExecutionWorkspaceID != "" && c.count(`SELECT count(*) FROM execution_workspaces
		WHERE id = $1 AND finalize_state = 'settled'`, r.ExecutionWorkspaceID) == 1
}

// freeAddr is a free loopback address.
func (c *nodeCluster) freeAddr() string {
	c.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startCluster starts the web node and two workers, and waits until all three are alive.
func (c *nodeCluster) startCluster() {
	c.t.Helper()
	c.startNodes(2, "3")
}

// startNodes starts the web node and workers `berth worker` processes (w1, w2, …) with
// maxWorkers each, and waits until all are alive.
func (c *nodeCluster) startNodes(workers int, maxWorkers string) {
	c.t.Helper()
	addr := c.freeAddr()
	c.base = "http://" + addr
	c.start("web", map[string]string{"BERTH_ADDR": addr}, "serve", "--workers=false")
	c.waitFor("the web node to answer", 2*time.Minute, func() bool {
		resp, err := http.Get(c.base + "/api/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for i := 1; i <= workers; i++ {
		c.start("w"+strconv.Itoa(i), nil, "worker", "--internal-addr", c.freeAddr(), "--max-workers", maxWorkers)
	}
	c.waitFor("every node alive", 2*time.Minute, func() bool {
		var out struct {
			Items []struct {
				ID       string `json:"id"`
				Alive    bool   `json:"alive"`
				Works    bool   `json:"works"`
				Capacity int    `json:"capacity"`
			} `json:"items"`
		}
		if code := c.api("GET", "/api/nodes", c.admin, nil, &out); code != http.StatusOK {
			c.t.Fatalf("GET /api/nodes as admin: %d", code)
		}
		alive := 0
		for _, n := range out.Items {
			if n.Alive {
				alive++
			}
			// A worker registers its --max-workers as its capacity (placement); the web node none.
			if want := map[bool]string{true: maxWorkers, false: "0"}[n.Works]; strconv.Itoa(n.Capacity) != want {
				c.t.Fatalf("node %s (works %v): capacity %d, want %s", n.ID, n.Works, n.Capacity, want)
			}
		}
		return alive == workers+1
	})
	if code := c.api("GET", "/api/nodes", c.token, nil, nil); code != http.StatusNotFound {
		c.t.Fatalf("GET /api/nodes as a board member: %d, want 404", code)
	}
}

// TestNodesScaleOut: 12 simultaneous runs on 12 tasks through the web node each complete once,
// with one finalize commit, on both workers and never the web node; a preview of a worker's
// workspace answers through the web node; SIGKILL of the worker holding a `sleep 120` run
// settles that run (orphaned, lease not active, no process left) within 2 minutes while the
// other worker's run goes on, and a new run succeeds.
func TestNodesScaleOut(t *testing.T) {
	t.Parallel()
	c := newNodeCluster(t)
	c.startCluster()

	// 12 simultaneous runs.
	const n = 12
	tasks, keys, runs := make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		tasks[i], keys[i] = c.task(`echo "$BERTH_RUN_ID" >> out.txt`)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { runs[i] = c.runOf(tasks[i]) })
	}
	wg.Wait()
	c.waitFor("12 runs to settle", 3*time.Minute, func() bool {
		for _, id := range runs {
			if !c.settled(id) {
				return false
			}
		}
		return true
	})
	byNode := map[string]int{}
	taskOn := map[string]string{} // a task of each worker
	for i, id := range runs {
		r := c.run(id)
		if r.Status != db.RunSucceeded {
			t.Fatalf("run %d: %s %s %s", i, r.Status, r.ErrorCode, r.ErrorMessage)
		}
		byNode[r.NodeID]++
		taskOn[r.NodeID] = tasks[i]
		if k := c.count(`SELECT count(*) FROM river_job WHERE kind = 'execute_run' AND args->>'run_id' = $1`, id); k != 1 {
			t.Errorf("run %d has %d execute_run jobs", i, k)
		}
		if ws := c.count(`SELECT count(*) FROM execution_workspaces WHERE id = $1 AND node_id = $2`, r.ExecutionWorkspaceID, r.NodeID); ws != 1 {
			t.Errorf("run %d's workspace is not on its node %s", i, r.NodeID)
		}
		if got := c.git("rev-list", "--count", "main..berth/"+keys[i]); got != "1" {
			t.Errorf("task %s has %s finalize commits, want 1", keys[i], got)
		}
		if got := c.git("show", "berth/"+keys[i]+":out.txt"); got != id {
			t.Errorf("task %s's commit holds %q, want the run id once", keys[i], got)
		}
	}
	t.Logf("runs by node: %v", byNode)
	if byNode["w1"] == 0 || byNode["w2"] == 0 || byNode["web"] != 0 || byNode["w1"]+byNode["w2"] != n {
		t.Fatalf("runs by node = %v: both workers must work, the web node never", byNode)
	}

	// The close-readiness of a worker's workspace, through the web node: the worker reads its
	// git state. Closing it (its branch holds the run's commit: destructive) runs on that worker.
	closing := c.run(runs[1])
	var rd struct {
		State string `json:"state"`
		Git   *struct {
			Readable bool `json:"readable"`
			Ahead    int  `json:"ahead"`
		} `json:"git"`
	}
	if code := c.api("GET", "/api/execution-workspaces/"+closing.ExecutionWorkspaceID+"/close-readiness", c.token, nil, &rd); code != http.StatusOK ||
		rd.Git == nil || !rd.Git.Readable || rd.Git.Ahead != 1 {
		t.Fatalf("close-readiness through the web node: %d %+v %+v", code, rd, rd.Git)
	}
	var ref string
	if err := c.pool.QueryRow(context.Background(), `SELECT ref FROM execution_workspaces WHERE id = $1`,
		closing.ExecutionWorkspaceID).Scan(&ref); err != nil {
		t.Fatal(err)
	}
	wsDir := filepath.Join(c.dirs[closing.NodeID], "workspaces", ref)
	if _, err := os.Stat(wsDir); err != nil {
		t.Fatalf("the workspace's directory on its node: %v", err)
	}
	if _, err := c.pool.Exec(context.Background(), `UPDATE tasks SET status = 'done' WHERE id = $1`, tasks[1]); err != nil {
		t.Fatal(err) // an open task bound to the workspace blocks its close
	}
	var refused map[string]any
	if code := c.api("PATCH", "/api/execution-workspaces/"+closing.ExecutionWorkspaceID, c.token,
		map[string]any{"status": "closed", "confirm_destructive": true}, &refused); code != http.StatusAccepted {
		t.Fatalf("close a worker's workspace: %d %v", code, refused)
	}
	c.waitFor("the worker to close its workspace", time.Minute, func() bool {
		return c.count(`SELECT count(*) FROM execution_workspaces WHERE id = $1 AND status = 'closed'`, closing.ExecutionWorkspaceID) == 1
	})
	if _, err := os.Stat(wsDir); !os.IsNotExist(err) {
		t.Fatalf("the closed workspace's directory on its node: %v", err)
	}

	// A preview of a worker's workspace, through the web node.
	ws := c.run(runs[0]).ExecutionWorkspaceID
	svcNode := c.run(runs[0]).NodeID
	if code := c.api("POST", "/api/execution-workspaces/"+ws+"/runtime-services/start", c.token, map[string]string{"name": "web"}, nil); code != http.StatusAccepted {
		t.Fatalf("start the service: %d", code)
	}
	var svcID, svcURL string
	c.waitFor("the service to run", time.Minute, func() bool {
		var list struct {
			Items []struct {
				ID     string  `json:"id"`
				URL    string  `json:"url"`
				Status string  `json:"status"`
				NodeID *string `json:"node_id"`
			} `json:"items"`
		}
		c.api("GET", "/api/execution-workspaces/"+ws+"/runtime-services", c.token, nil, &list)
		for _, s := range list.Items {
			if s.Status == "failed" {
				t.Fatalf("the service failed: %+v", s)
			}
			if s.Status == "running" && s.NodeID != nil {
				if *s.NodeID != svcNode {
					t.Fatalf("the service runs on %s, its workspace is on %s", *s.NodeID, svcNode)
				}
				svcID, svcURL = s.ID, s.URL
				return true
			}
		}
		return false
	})
	// The web node's preview listener serves it (a port of BERTH_PREVIEW_PORTS), forwarding to
	// the worker that runs it.
	if !strings.HasPrefix(svcURL, "http://localhost:") {
		t.Fatalf("the service's url = %q, want a port on the web node's preview listener", svcURL)
	}
	req, _ := http.NewRequest("GET", svcURL+"index.html", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "served from a worker") {
		t.Fatalf("preview through the web node: %d %q", resp.StatusCode, body)
	}
	other := map[string]string{"w1": "w2", "w2": "w1"}
	if code := c.api("GET", "/preview/"+svcID+"/", c.admin, nil, nil); code != http.StatusNotFound {
		t.Errorf("a non-member's preview: %d, want 404", code)
	}
	req, _ = http.NewRequest("GET", svcURL, nil)
	req.Header.Set("Authorization", "Bearer "+c.admin)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("a non-member on the preview origin: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	// SIGKILL the worker holding a `sleep 120` run. Each task continues in its workspace, so a
	// second run goes to the node that holds it.
	victim, survivor := svcNode, other[svcNode]
	if _, err := c.pool.Exec(context.Background(), `UPDATE tasks SET command = 'sleep 120' WHERE id = ANY($1)`,
		[]string{taskOn[victim], taskOn[survivor]}); err != nil {
		t.Fatal(err)
	}
	doomed, kept := c.runOf(taskOn[victim]), c.runOf(taskOn[survivor])
	c.waitFor("both sleeps to run", time.Minute, func() bool {
		return c.run(doomed).Status == db.RunRunning && c.run(kept).Status == db.RunRunning &&
			len(survivors(t, doomed)) > 0 && len(survivors(t, kept)) > 0
	})
	if a, b := c.run(doomed).NodeID, c.run(kept).NodeID; a != victim || b != survivor {
		t.Fatalf("continuing runs on %s and %s, want %s and %s (where their workspaces are)", a, b, victim, survivor)
	}
	p := c.procs[victim]
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	killedAt := time.Now()
	// Within 2 minutes of the SIGKILL: the run settled, its lease not active, none of its
	// processes left (each is reached at its own moment: the run and the lease in two
	// transactions of the takeover, the processes when the kernel ends the jail's namespace).
	var (
		r    db.Run
		left []string
	)
	c.waitFor("the dead worker's run to be settled, its lease expired and its processes gone", 2*time.Minute, func() bool {
		r = c.run(doomed)
		if r.Live() {
			return false
		}
		l, err := db.LeaseByID(context.Background(), c.pool, c.company, r.LeaseID)
		if err != nil {
			t.Fatal(err)
		}
		left = survivors(t, doomed)
		return !l.Live() && len(left) == 0
	})
	t.Logf("settled %s after the SIGKILL", time.Since(killedAt).Round(time.Millisecond))
	if r.Status != db.RunFailed || r.ErrorCode != "orphaned" {
		t.Fatalf("dead worker's run = %s/%s (%s)", r.Status, r.ErrorCode, r.ErrorMessage)
	}
	if k := c.run(kept); k.Status != db.RunRunning {
		t.Fatalf("the other worker's run = %s/%s", k.Status, k.ErrorCode)
	}
	if l, err := db.LeaseByID(context.Background(), c.pool, c.company, c.run(kept).LeaseID); err != nil || !l.Live() {
		t.Fatalf("the other worker's lease: %s %v", l.Status, err)
	}
	// The dead node's workspace cannot take another run; a new task runs on the survivor.
	var refusal struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := c.api("POST", "/api/tasks/"+taskOn[victim]+"/runs", c.token, nil, &refusal); code != http.StatusConflict ||
		refusal.Error.Code != "node_unavailable" {
		t.Errorf("a run in the dead node's workspace: %d %s, want 409 node_unavailable", code, refusal.Error.Code)
	}
	fresh, _ := c.task("true")
	next := c.runOf(fresh)
	c.waitFor("a new run to settle", 2*time.Minute, func() bool { return c.settled(next) })
	if r := c.run(next); r.Status != db.RunSucceeded || r.NodeID != survivor {
		t.Fatalf("new run = %s/%s on %s", r.Status, r.ErrorCode, r.NodeID)
	}
	if code := c.api("POST", "/api/runs/"+kept+"/cancel", c.token, nil, nil); code != http.StatusAccepted {
		t.Errorf("cancel the kept run: %d", code)
	}

	// The dead worker restarts with the same id and data dir: it works its queue again (the
	// orphaned run's finalize, waiting there, settles its workspace) and takes runs in its
	// workspaces again.
	c.start(victim, nil, "worker", "--internal-addr", c.freeAddr(), "--max-workers", "3")
	c.waitFor("the restarted node to settle the orphaned run's finalize", 2*time.Minute, func() bool { return c.settled(doomed) })
	if _, err := c.pool.Exec(context.Background(), `UPDATE tasks SET command = 'true' WHERE id = $1`, taskOn[victim]); err != nil {
		t.Fatal(err)
	}
	again := c.runOf(taskOn[victim])
	c.waitFor("a run in the restarted node's workspace to settle", 2*time.Minute, func() bool { return c.settled(again) })
	if r := c.run(again); r.Status != db.RunSucceeded || r.NodeID != victim {
		t.Fatalf("run after the restart = %s/%s on %s", r.Status, r.ErrorCode, r.NodeID)
	}
}

// dumpOnFailure logs the jobs and runs of a failed test.
func (c *nodeCluster) dumpOnFailure() {
	if !c.t.Failed() {
		return
	}
	ctx := context.Background()
	for _, q := range []string{
		`SELECT id || ' ' || kind || ' ' || queue || ' ' || state || ' ' || coalesce(array_to_string(attempted_by, ','), '') || ' ' || args::text FROM river_job ORDER BY id`,
		`SELECT r.id || ' ' || r.status || ' run_node=' || r.node_id || ' ws_node=' || coalesce(w.node_id, '-') || ' ws=' || coalesce(w.ref, '-') FROM runs r LEFT JOIN execution_workspaces w ON w.id = r.execution_workspace_id ORDER BY r.created_at`,
	} {
		rows, err := c.pool.Query(ctx, q)
		if err != nil {
			c.t.Log(err)
			continue
		}
		for rows.Next() {
			var line string
			_ = rows.Scan(&line)
			c.t.Log(line)
		}
		rows.Close()
	}
}

// TestNodeTimingAndInternalURL: the node intervals default to DESIGN §11's and refuse nonsense;
// the internal URL is the configured one or http://addr, with a wildcard host named by the host.
func TestNodeTimingAndInternalURL(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	d, err := nodeTiming(env(nil))
	if err != nil || d.Heartbeat != 5*time.Second || d.DeadAfter != 30*time.Second || d.Takeover != 10*time.Second {
		t.Fatalf("defaults: %+v %v", d, err)
	}
	if d, err := nodeTiming(env(nodeTimingVars)); err != nil || d.DeadAfter != 3*time.Second {
		t.Fatalf("test timing: %+v %v", d, err)
	}
	for _, bad := range []map[string]string{{"BERTH_NODE_HEARTBEAT": "soon"}, {"BERTH_NODE_DEAD_AFTER": "1ms"},
		{"BERTH_NODE_HEARTBEAT": "20s"}} {
		if _, err := nodeTiming(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	host, _ := os.Hostname()
	for _, tc := range []struct{ configured, addr, want string }{
		{"", "127.0.0.1:9000", "http://127.0.0.1:9000"},
		{"", "0.0.0.0:9000", "http://" + net.JoinHostPort(host, "9000")},
		{"https://w1.internal:9443/", "0.0.0.0:9000", "https://w1.internal:9443"},
	} {
		if got, err := internalURL(tc.configured, tc.addr); err != nil || got != tc.want {
			t.Errorf("internalURL(%q, %q) = %q %v, want %q", tc.configured, tc.addr, got, err, tc.want)
		}
	}
	if _, err := internalURL("w1:9000", "0.0.0.0:9000"); err == nil {
		t.Error("a URL without a scheme was accepted")
	}
}
