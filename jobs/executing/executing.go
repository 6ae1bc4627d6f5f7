// Package executing is one Berth process's knowledge of itself that the orphan sweep relies on
// (docs/runs.md "Crash recovery", docs/scaling.md): the runs it is working on right now, the River
// client id it fetches jobs under, and its claim on its node id. It owns that registry and the
// claim's dedicated connection; it touches nothing else in the database (the claim's locks are
// db.LockNodeShared and db.TryLockNodeExclusive), knows no job kind and imports nothing of jobs:
// package jobs registers runs in it (its run middleware), names its client by it and reads it in
// the sweep's verdict.
package executing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// Registry is what one process knows of itself: the runs it is working on right now (a provision
// or execute_run job in progress, Add), the River client id it fetches jobs under (node id + "@" +
// random, so a job's attempted_by tells which node fetched it), and its claim on its node id.
//
// The claim is a session advisory lock, shared, held on a dedicated connection for the life of
// the process: every working process of a node holds it before its client starts fetching. A
// sweep that can take the same lock exclusively (for the moment it reads its candidates) knows it
// is the only live process of its node, so a job still "running" under another client id of its
// node belongs to a process that is gone (crashed, killed, restarted). PostgreSQL ends a dead
// client's session, and so its claim, as soon as the socket closes.
type Registry struct {
	node     string
	clientID string

	mu   sync.Mutex
	runs map[string]int

	claimMu sync.Mutex // serializes every use of claim
	claim   *pgx.Conn  // holds the shared node lock; nil until Claim
	pool    *pgxpool.Pool
}

// New makes the registry of a process of node nodeID (at most 64 bytes, no "@").
func New(nodeID string) *Registry {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Registry{node: nodeID, clientID: nodeID + "@" + hex.EncodeToString(b[:]), runs: map[string]int{}}
}

// ClientID is the River client id this process works under.
func (e *Registry) ClientID() string {
	if e == nil {
		return ""
	}
	return e.clientID
}

// Add records that this process works on runID until the returned func is called.
func (e *Registry) Add(runID string) (done func()) {
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
func (e *Registry) Has(runID string) bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[runID] > 0
}

// OwnsHolder reports whether a River attempted_by entry is a client of this node (this process
// or an earlier one).
func (e *Registry) OwnsHolder(holder string) bool {
	return e != nil && e.node != "" && strings.HasPrefix(holder, e.node+"@")
}

// Claim takes this process's shared claim on its node id, waiting while a sweep holds it
// exclusively. Call it before the River client starts working, and Close at shutdown.
func (e *Registry) Claim(ctx context.Context, pool *pgxpool.Pool) error {
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	e.pool = pool
	return e.claimLocked(ctx)
}

func (e *Registry) claimLocked(ctx context.Context) error {
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
func (e *Registry) Close() {
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

// WhileSole runs fn while no other live process holds a claim on this node id (none can take
// one until fn returns) and reports sole = true; when another one holds it, or this process never
// claimed, fn runs without that guarantee and sole is false. A lost claim connection is claimed
// again first.
func (e *Registry) WhileSole(ctx context.Context, fn func(sole bool) error) error {
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
