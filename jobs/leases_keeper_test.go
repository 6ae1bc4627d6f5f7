package jobs

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// TestLeaseKeeper on real PostgreSQL: a confirmed renewal moves the keeper's local deadline and
// the lease's expiry; renewals the database does not answer (a pool whose connects are refused)
// leave the deadline where it was, so it runs out one TTL after the last confirmed renewal; once
// the lease has been expired (generation + 1) a renewal under the old generation is ErrFenced and
// leaves the lease as it is.
func TestLeaseKeeper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	id := w.run(db.RunRunning, "n1", 0)
	r := w.runRow(id)
	const ttl = 600 * time.Millisecond
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: r.ExecutionWorkspaceID, TaskID: r.TaskID, RunID: id, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	k := newLeaseKeeper(w.pool, lease, ttl)
	if k.every() != ttl/3 {
		t.Fatalf("renewal period %v, want TTL/3", k.every())
	}
	time.Sleep(ttl / 2)
	before := k.remaining()
	if err := k.renew(ctx); err != nil {
		t.Fatal(err)
	}
	if k.remaining() <= before {
		t.Fatalf("a confirmed renewal did not move the deadline: %v then %v", before, k.remaining())
	}
	var expiresIn time.Duration
	if err := w.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - now()) * interval '1 second'
		FROM environment_leases WHERE id = $1`, lease.ID).Scan(&expiresIn); err != nil || expiresIn > ttl {
		t.Fatalf("lease expires in %v (%v), want within the keeper's TTL %v", expiresIn, err, ttl)
	}

	cfg, err := pgxpool.ParseConfig(w.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	down, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	cut := *k
	cut.pool = down
	for cut.remaining() > 0 {
		if err := cut.renew(ctx); err == nil || errors.Is(err, db.ErrFenced) {
			t.Fatalf("renewal against an unreachable database = %v", err)
		}
		time.Sleep(cut.every() / 2)
	}
	if err := cut.renew(ctx); !errors.Is(err, errLeaseLost) {
		t.Fatalf("renewal past the local deadline = %v, want errLeaseLost", err)
	}

	// The database expires the lease (generation + 1) once its own clock passes expires_at, which
	// is no earlier than the keeper's deadline; the old holder is then fenced.
	var expired []db.Lease
	for deadline := time.Now().Add(10 * time.Second); len(expired) == 0; time.Sleep(20 * time.Millisecond) {
		if expired, err = db.ExpireLeases(ctx, w.pool, 10); err != nil || time.Now().After(deadline) {
			t.Fatalf("lease not expired by the database: %v", err)
		}
	}
	if len(expired) != 1 || expired[0].Generation != lease.Generation+1 {
		t.Fatalf("expired = %+v", expired)
	}
	stale := newLeaseKeeper(w.pool, lease, ttl)
	if err := stale.renew(ctx); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("renewal under the old generation = %v, want ErrFenced", err)
	}
	if l, err := db.LeaseByID(ctx, w.pool, w.company, lease.ID); err != nil || l.Status != db.LeaseExpired {
		t.Fatalf("lease after the fenced renewal = %+v, %v", l, err)
	}
}
