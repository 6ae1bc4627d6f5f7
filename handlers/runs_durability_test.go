package handlers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/environment"
	"berth/jobs"
)

// partition stands between the executor's connection pool and PostgreSQL: its dial function makes
// real connections to the test database until Cut, which closes every connection it made and
// refuses new ones (as a dead postmaster or a network partition would look to Berth); Restore lets
// new connections through again.
type partition struct {
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	d     net.Dialer
}

func (p *partition) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return nil, errors.New("partition: the database is unreachable")
	}
	c, err := p.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.conns[c] = struct{}{}
	return c, nil
}

// Cut drops every connection and refuses new ones.
func (p *partition) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Restore accepts connections again.
func (p *partition) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// setupRunsBehind is setupRuns with the workers (River client and executors) on a pool of their
// own that goes through a partition, while the API server and the test keep a direct pool: the
// test cuts the executor's database and still watches what the database holds.
func setupRunsBehind(t *testing.T, leaseTTL time.Duration) (*runEnv, *partition) {
	t.Helper()
	return setupRunsBehindWith(t, leaseTTL, "")
}

// setupRunsBehindWith is setupRunsBehind with a setup command on the project workspace.
func setupRunsBehindWith(t *testing.T, leaseTTL time.Duration, setup string) (*runEnv, *partition) {
	t.Helper()
	part := &partition{}
	re := setupRunsWorkers(t, func(jd *jobs.Deps) {
		cfg, err := pgxpool.ParseConfig(jd.Pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DialFunc = part.dial
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close) // after the workers stop (cleanups run last first)
		jd.Pool, jd.LeaseTTL = pool, leaseTTL
	})
	t.Cleanup(part.Restore) // first: the workers stop on a reachable database
	re.workspaceWith(setup)
	return re, part
}

// spooled reports whether the run's outcome waits in the node's spool.
func (re *runEnv) spooled(id string) bool {
	_, err := os.Stat(filepath.Join(re.dataDir, "spool", "runs", id+".json"))
	return err == nil
}

// waitFor polls cond every 50 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunOutcomeSurvivesDatabaseOutage: a run's command sleeps, prints its last line and exits 3
// while the executor's database is cut. The outcome waits in the spool (the run row still says
// running) and the executor keeps retrying; once the database is back the run ends failed with
// exit code 3, error_code command_failed and its last log line, not orphaned, finalize settles,
// the lease is released and the spool file is gone.
func TestRunOutcomeSurvivesDatabaseOutage(t *testing.T) {
	t.Parallel()
	re, part := setupRunsBehind(t, 0)
	task := re.task(`echo started; sleep 3; echo LAST-LINE-BEFORE-EXIT; exit 3`)
	id := re.start(task.ID, nil)
	re.waitRun(id, "running", func(r map[string]any) bool { return r["status"] == "running" })
	part.Cut()
	waitFor(t, 30*time.Second, "the outcome spooled during the outage", func() bool { return re.spooled(id) })
	time.Sleep(2 * time.Second) // several failed final writes
	var status string
	if err := re.pool.QueryRow(context.Background(), `SELECT status FROM runs WHERE id = $1`, id).Scan(&status); err != nil || status != "running" {
		t.Fatalf("during the outage the run row says %q (%v), want still running", status, err)
	}
	part.Restore()
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["exit_code"] != float64(3) || run["error_code"] != "command_failed" {
		t.Fatalf("run after the outage = %v, want failed, exit 3, command_failed", run)
	}
	if log := re.log(id); !strings.Contains(log, "started\n") || !strings.HasSuffix(log, "LAST-LINE-BEFORE-EXIT\n") {
		t.Fatalf("log after the outage = %q", log)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("finalize %q, lease %q; want settled and released", fin, lease)
	}
	if re.spooled(id) {
		t.Fatal("the spool file outlived the write")
	}
	code, out := re.call(re.r.Viewer, http.MethodGet, "/api/runs/"+id, nil)
	if code != http.StatusOK || out["error_code"] == "orphaned" {
		t.Fatalf("run = %d %v", code, out)
	}
}

// TestRunLeaseLostWhenHeartbeatsFail: with a 3 s lease TTL, the executor's database is cut while
// the command sleeps. Having renewed nothing for a whole TTL, the executor kills the command's
// processes while the database is still unreachable, and spools failed/lease_lost; once the
// database is back the run says so, the lease was never renewed after the cut, and a write under
// the old generation is refused.
func TestRunLeaseLostWhenHeartbeatsFail(t *testing.T) {
	t.Parallel()
	re, part := setupRunsBehind(t, 3*time.Second)
	task := re.task(`echo started; sleep 300`)
	id := re.start(task.ID, nil)
	re.waitRun(id, "running", func(r map[string]any) bool { return r["status"] == "running" })
	waitFor(t, 30*time.Second, "the command's processes", func() bool {
		pids, err := environment.FindTagged(id)
		return err == nil && len(pids) > 0
	})
	ctx := context.Background()
	part.Cut()
	var leaseID string
	var gen int64
	var beat time.Time
	if err := re.pool.QueryRow(ctx, `SELECT id, generation, heartbeat_at FROM environment_leases WHERE run_id = $1`, id).
		Scan(&leaseID, &gen, &beat); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the command stopped without its database", func() bool {
		pids, err := environment.FindTagged(id)
		return err == nil && len(pids) == 0
	})
	waitFor(t, 10*time.Second, "the lease_lost outcome spooled", func() bool { return re.spooled(id) })
	part.Restore()
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["error_code"] != "lease_lost" {
		t.Fatalf("run = %v, want failed/lease_lost", run)
	}
	if log := re.log(id); !strings.HasPrefix(log, "started\n") {
		t.Fatalf("log = %q", log)
	}
	re.settled(run)
	var after time.Time
	if err := re.pool.QueryRow(ctx, `SELECT heartbeat_at FROM environment_leases WHERE id = $1`, leaseID).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !after.Equal(beat) {
		t.Fatalf("the lease was renewed after the cut: heartbeat %v, then %v", beat, after)
	}
	if _, err := db.HeartbeatLease(ctx, re.pool, leaseID, gen, time.Minute); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("a heartbeat under the lost generation = %v, want ErrFenced", err)
	}
}

// TestSetupStoppedWhenHeartbeatsFail: the setup command holds the run's lease like the run's
// command. With a 3 s TTL the executor's database is cut while the setup command sleeps: having
// renewed nothing for a whole TTL, the executor stops the setup command's processes while the
// database is still unreachable; once it is back the run ends failed/lease_lost, the setup step
// is not run a second time, and the run's command never ran.
func TestSetupStoppedWhenHeartbeatsFail(t *testing.T) {
	t.Parallel()
	re, part := setupRunsBehindWith(t, 3*time.Second, `echo setup-started; sleep 300`)
	task := re.task(`echo the-command-ran`)
	id := re.start(task.ID, nil)
	waitFor(t, 60*time.Second, "the setup command's processes", func() bool {
		pids, err := environment.FindTagged(id)
		return err == nil && len(pids) > 0
	})
	part.Cut()
	waitFor(t, 30*time.Second, "the setup command stopped without its database", func() bool {
		pids, err := environment.FindTagged(id)
		return err == nil && len(pids) == 0
	})
	part.Restore()
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["error_code"] != "lease_lost" {
		t.Fatalf("run = %v, want failed/lease_lost", run)
	}
	if log := re.log(id); strings.Contains(log, "the-command-ran") {
		t.Fatalf("the run's command ran after its setup lost the lease: %q", log)
	}
	ctx := context.Background()
	var setups int
	if err := re.pool.QueryRow(ctx, `SELECT count(*) FROM workspace_operations WHERE run_id = $1 AND phase = 'setup'`, id).Scan(&setups); err != nil {
		t.Fatal(err)
	}
	if setups != 1 {
		t.Fatalf("%d setup steps, want the one that was stopped", setups)
	}
	time.Sleep(2 * time.Second) // a retried provision would have started the setup again by now
	if pids, err := environment.FindTagged(id); err != nil || len(pids) != 0 {
		t.Fatalf("processes of the run after it ended: %v %v", pids, err)
	}
}
