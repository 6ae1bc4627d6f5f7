package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
)

// Executing is one Berth process's knowledge of itself that the orphan sweep relies on: the runs
// it is working on right now (a provision or execute_run job in progress), the River client id
// it fetches jobs under (node id + "@" + random, so a job's attempted_by tells which node fetched
// it), and its claim on its node id.
//
// The claim is a session advisory lock, shared, held on a dedicated connection for the life of
// the process: every working process of a node holds it before its client starts fetching. A
// sweep that can take the same lock exclusively (for the moment it reads its candidates) knows it
// is the only live process of its node, so a job still "running" under another client id of its
// node belongs to a process that is gone (crashed, killed, restarted). PostgreSQL ends a dead
// client's session, and so its claim, as soon as the socket closes.
type Executing struct {
	node     string
	clientID string

	mu          sync.Mutex
	runs        map[string]int
	report      unmanagedReport // the last unmanaged report this process knows of
	reportKnown bool
	reportMu    sync.Mutex // one unmanaged report at a time

	claimMu sync.Mutex // serializes every use of claim
	claim   *pgx.Conn  // holds the shared node lock; nil until Claim
	pool    *pgxpool.Pool
}

// NewExecuting makes the registry of a process of node nodeID (at most 64 bytes, no "@").
func NewExecuting(nodeID string) *Executing {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Executing{node: nodeID, clientID: nodeID + "@" + hex.EncodeToString(b[:]), runs: map[string]int{}}
}

// ClientID is the River client id this process works under.
func (e *Executing) ClientID() string {
	if e == nil {
		return ""
	}
	return e.clientID
}

// add records that this process works on runID until the returned func is called.
func (e *Executing) add(runID string) (done func()) {
	if e == nil {
		return func() {}
	}
	e.mu.Lock()
	e.runs[runID]++
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.runs[runID]--; e.runs[runID] <= 0 {
			delete(e.runs, runID)
		}
	}
}

// Has reports whether this process is working on runID right now.
func (e *Executing) Has(runID string) bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[runID] > 0
}

// ownsHolder reports whether a River attempted_by entry is a client of this node (this process
// or an earlier one).
func (e *Executing) ownsHolder(holder string) bool {
	return e != nil && e.node != "" && strings.HasPrefix(holder, e.node+"@")
}

// Claim takes this process's shared claim on its node id, waiting while a sweep holds it
// exclusively. Call it before the River client starts working, and Close at shutdown.
func (e *Executing) Claim(ctx context.Context, pool *pgxpool.Pool) error {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	e.pool = pool
	return e.claimLocked(ctx)
}

func (e *Executing) claimLocked(ctx context.Context) error {
	if e.claim != nil && !e.claim.IsClosed() {
		return nil
	}
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("claim node %s: %w", e.node, err)
	}
	if err := db.LockNodeShared(ctx, conn, e.node); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return err
	}
	e.claim = conn
	return nil
}

// Close gives the claim back for good: later sweeps of this process no longer speak for the node.
func (e *Executing) Close() {
	if e == nil {
		return
	}
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	e.pool = nil
	if e.claim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.claim.Close(ctx)
		e.claim = nil
	}
}

// whileSole runs fn while no other live process holds a claim on this node id (none can take
// one until fn returns) and reports sole = true; when another one holds it, or this process never
// claimed, fn runs without that guarantee and sole is false. A lost claim connection is claimed
// again first.
func (e *Executing) whileSole(ctx context.Context, fn func(sole bool) error) error {
	if e == nil || e.node == "" {
		return fn(false)
	}
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	if e.pool == nil {
		return fn(false)
	}
	var tx pgx.Tx
	for attempt := 0; ; attempt++ {
		err := e.claimLocked(ctx)
		if err == nil {
			if tx, err = e.claim.Begin(ctx); err == nil {
				break
			}
		}
		if e.claim != nil {
			_ = e.claim.Close(context.WithoutCancel(ctx))
			e.claim = nil
		}
		if attempt == 1 || ctx.Err() != nil {
			return fn(false)
		}
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // ends the exclusive lock
	sole, err := db.TryLockNodeExclusive(ctx, tx, e.node)
	return fn(err == nil && sole)
}

// heartbeatEvery is how often a run's executor proves it is alive (the run's heartbeat_at the
// orphan sweep reads); execute_run's watcher also beats with each lease renewal, every TTL/3.
const heartbeatEvery = leaseTTL / 4

// runMiddleware wraps the jobs that execute a run (provision, execute_run): while one works, the
// run is in this process's Executing registry and its heartbeat is kept fresh (provision's lease
// too, which nothing else heartbeats during a long setup command), so no sweep takes it for an
// orphan.
type runMiddleware struct {
	river.MiddlewareDefaults
	deps Deps
}

var _ rivertype.WorkerMiddleware = (*runMiddleware)(nil)

// Work registers the job's run, beats for it, and runs the job.
func (m *runMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	provision := job.Kind == (ProvisionArgs{}).Kind()
	if !provision && job.Kind != (ExecuteRunArgs{}).Kind() {
		return doInner(ctx)
	}
	var args struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(job.EncodedArgs, &args); err != nil || args.RunID == "" {
		return doInner(ctx)
	}
	done := m.deps.Executing.add(args.RunID)
	defer done()

	beatCtx, stop := context.WithCancel(ctx)
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			m.beat(beatCtx, args.RunID, provision)
			select {
			case <-beatCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stop(); <-beating }()
	return doInner(ctx)
}

// beat heartbeats a live run and, for provision, the run's live lease at its current generation.
func (m *runMiddleware) beat(ctx context.Context, runID string, lease bool) {
	run, err := db.RunForJob(ctx, m.deps.Pool, runID)
	if err != nil || !run.Live() {
		return
	}
	if err := db.HeartbeatRun(ctx, m.deps.Pool, runID); err != nil {
		return
	}
	if !lease || run.LeaseID == "" {
		return
	}
	l, err := db.LeaseByID(ctx, m.deps.Pool, run.CompanyID, run.LeaseID)
	if err != nil || !l.Live() || l.RunID != run.ID {
		return
	}
	_, _ = db.HeartbeatLease(ctx, m.deps.Pool, l.ID, l.Generation, leaseTTL)
}
