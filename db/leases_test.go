package db_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
)

// leaseFixture is a company with environments, execution workspaces, and runs of tasks to lease for.
type leaseFixture struct {
	pool    *pgxpool.Pool
	company string
	envs    []string
	ws      []string
	tasks   []string // tasks[i] is the task of runs[i]; there is always at least one
	runs    []string
}

// setupLeases creates a fresh database holding one company with envs environments, workspaces
// execution workspaces and runs runs, each of its own task.
func setupLeases(t testing.TB, envs, workspaces, runs int) leaseFixture {
	t.Helper()
	return addLeaseCompany(t, dbtest.New(t), "acme", envs, workspaces, runs)
}

// addLeaseCompany inserts another company with its environments, project, tasks, execution
// workspaces and running runs.
func addLeaseCompany(t testing.TB, pool *pgxpool.Pool, slug string, envs, workspaces, runs int) leaseFixture {
	t.Helper()
	ctx := context.Background()
	f := leaseFixture{pool: pool}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("lease fixture: %v", err)
		}
	}
	ids := func(sql string, args ...any) []string {
		t.Helper()
		rows, err := pool.Query(ctx, sql, args...)
		must(err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			must(rows.Scan(&id))
			out = append(out, id)
		}
		must(rows.Err())
		return out
	}
	var project string
	must(pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ($1, $1) RETURNING id`, slug).Scan(&f.company))
	f.envs = ids(`INSERT INTO environments (company_id, name, driver)
		SELECT $1, 'env-' || g, 'local' FROM generate_series(1, $2) g ORDER BY g RETURNING id`, f.company, envs)
	must(pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'Project', 'PRJ') RETURNING id`,
		f.company).Scan(&project))
	f.ws = ids(`INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref)
		SELECT $1, $2, 'isolated', 'copy', 'ws-' || md5(gen_random_uuid()::text)
		FROM generate_series(1, $3) g ORDER BY g RETURNING id`, f.company, project, workspaces)
	f.tasks = ids(`INSERT INTO tasks (company_id, project_id, number, key, title)
		SELECT $1, $2, g, 'PRJ-' || g, 'Task ' || g FROM generate_series(1, greatest($3, 1)) g ORDER BY g
		RETURNING id`, f.company, project, runs)
	f.runs = ids(`INSERT INTO runs (company_id, task_id, status)
		SELECT $1, t.id, 'running' FROM unnest($2::uuid[]) WITH ORDINALITY t (id, n)
		WHERE n <= $3 ORDER BY n RETURNING id`, f.company, f.tasks, runs)
	return f
}

// request asks for the lease of environment e on workspace w for run r and its task (-1: no run,
// the first task), for an hour.
func (f leaseFixture) request(e, w, r int) db.LeaseRequest {
	req := db.LeaseRequest{CompanyID: f.company, EnvironmentID: f.envs[e], ExecutionWorkspaceID: f.ws[w],
		TaskID: f.tasks[max(r, 0)], TTL: time.Hour}
	if r >= 0 {
		req.RunID = f.runs[r]
	}
	return req
}

func (f leaseFixture) acquire(t *testing.T, e, w, r int) db.Lease {
	t.Helper()
	l, err := db.AcquireLease(context.Background(), f.pool, f.request(e, w, r))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return l
}

// row is the whole stored lease row as JSON ("" when it is gone), to compare before and after.
func (f leaseFixture) row(t *testing.T, id string) string {
	t.Helper()
	var s string
	err := f.pool.QueryRow(context.Background(), `SELECT coalesce((SELECT to_jsonb(l)::text
		FROM environment_leases l WHERE id = $1), '')`, id).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fencedEvents returns the details of the lease.fenced audit events about lease id, oldest first,
// each checked to be a system event of the lease's company.
func (f leaseFixture) fencedEvents(t *testing.T, id string) []map[string]any {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT coalesce(company_id::text, ''), actor_type, details
		FROM audit_events WHERE action = 'lease.fenced' AND target_type = 'environment_lease' AND target_id = $1
		ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var company, actor string
		var details map[string]any
		if err := rows.Scan(&company, &actor, &details); err != nil {
			t.Fatal(err)
		}
		if company != f.company || actor != db.ActorSystem {
			t.Errorf("lease.fenced event: company %q actor %q, want %q system", company, actor, f.company)
		}
		out = append(out, details)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// liveCount is the number of live leases of environment e on workspace w.
func (f leaseFixture) liveCount(ctx context.Context, q db.Querier, e, w int) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM environment_leases
		WHERE environment_id = $1 AND execution_workspace_id = $2 AND status IN ('acquiring', 'active', 'releasing')`,
		f.envs[e], f.ws[w]).Scan(&n)
	return n, err
}

// TestLeaseAcquireRace: two workers on their own connections race for one lease 1,000 times,
// released behind a barrier together; each round has exactly one winner, the loser gets
// ErrLeaseBusy, and the database never holds two live leases for the (environment, workspace).
func TestLeaseAcquireRace(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 1, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var conns [2]*pgxpool.Conn
	for i := range conns {
		c, err := f.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		conns[i] = c
	}
	type result struct {
		lease db.Lease
		err   error
	}
	const rounds = 1000
	seen := map[string]bool{}
	wins := [2]int{}
	for round := range rounds {
		gate := make(chan struct{})
		var ready, done sync.WaitGroup
		var results [2]result
		for w := range 2 {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-gate
				l, err := db.AcquireLease(ctx, conns[w], f.request(0, 0, w))
				results[w] = result{l, err}
			}()
		}
		ready.Wait()
		close(gate)
		done.Wait()
		winner := -1
		for w, r := range results {
			switch {
			case r.err == nil && winner >= 0:
				t.Fatalf("round %d: double grant: %s and %s", round, results[winner].lease.ID, r.lease.ID)
			case r.err == nil:
				winner = w
			case !errors.Is(r.err, db.ErrLeaseBusy):
				t.Fatalf("round %d: worker %d: %v, want a lease or ErrLeaseBusy", round, w, r.err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody won: %v / %v", round, results[0].err, results[1].err)
		}
		l := results[winner].lease
		if seen[l.ID] || l.Generation != 1 || l.Status != db.LeaseActive || l.RunID != f.runs[winner] {
			t.Fatalf("round %d: winner's lease %+v (seen before: %v)", round, l, seen[l.ID])
		}
		seen[l.ID] = true
		wins[winner]++
		if n, err := f.liveCount(ctx, conns[0], 0, 0); err != nil || n != 1 {
			t.Fatalf("round %d: %d live leases (%v), want 1", round, n, err)
		}
		if _, err := db.ReleaseLease(ctx, conns[winner], l, "round over"); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
	var total, released int
	if err := f.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'released')
		FROM environment_leases`).Scan(&total, &released); err != nil {
		t.Fatal(err)
	}
	if total != rounds || released != rounds {
		t.Fatalf("%d leases, %d released; want %d of each", total, released, rounds)
	}
	t.Logf("wins per worker: %v", wins)
}

// TestLeaseAcquireAndReleaseReturnTheRow: AcquireLease and ReleaseLease read back only the
// columns they decide and fill in the rest; what they return must still be the stored row.
func TestLeaseAcquireAndReleaseReturnTheRow(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 1, 1, 1)
	ctx := context.Background()
	same := func(step string, got db.Lease) {
		t.Helper()
		stored, err := db.LeaseByID(ctx, f.pool, f.company, got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ReadAt.IsZero() || got.ReadAt.After(stored.ReadAt) {
			t.Errorf("%s: ReadAt %v, read again at %v", step, got.ReadAt, stored.ReadAt)
		}
		got.ReadAt, stored.ReadAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, stored) {
			t.Errorf("%s returned\n%+v\nstored\n%+v", step, got, stored)
		}
	}
	l := f.acquire(t, 0, 0, 0)
	same("acquire", l)
	if l.Status != db.LeaseActive || l.Generation != 1 || l.RunID != f.runs[0] || l.TaskID != f.tasks[0] ||
		l.ExpiresAt == nil || !l.ExpiresAt.After(l.CreatedAt) {
		t.Fatalf("acquired %+v", l)
	}
	released, err := db.ReleaseLease(ctx, f.pool, l, "run succeeded")
	if err != nil {
		t.Fatal(err)
	}
	same("release", released)
	if released.Status != db.LeaseReleased || released.CleanupStatus != db.LeaseCleanupPending ||
		released.FailureReason != "run succeeded" || released.ReleasedAt == nil {
		t.Fatalf("released %+v", released)
	}
}

// TestLeaseFencedWrites: a holder presenting a stale generation, or writing to a lease that is no
// longer in the status its write starts from, gets ErrFenced; the row stays exactly as it was and
// a lease.fenced event records the attempted operation and both generations.
func TestLeaseFencedWrites(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 1, 17, 1)
	ctx := context.Background()
	// expire ends lease l through the database clock, as the sweeper would: generation + 1.
	expire := func(t *testing.T, l db.Lease) db.Lease {
		t.Helper()
		if _, err := f.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() - interval '1 second'
			WHERE id = $1`, l.ID); err != nil {
			t.Fatal(err)
		}
		got, err := db.ExpireLeases(ctx, f.pool, 100)
		if err != nil || len(got) != 1 || got[0].ID != l.ID {
			t.Fatalf("expire: %v %+v", err, got)
		}
		return got[0]
	}
	heartbeat := func(l db.Lease, gen int64) error {
		_, err := db.HeartbeatLease(ctx, f.pool, l.ID, gen, time.Hour)
		return err
	}
	release := func(l db.Lease, gen int64) error {
		l.Generation = gen
		_, err := db.ReleaseLease(ctx, f.pool, l, "done")
		return err
	}
	fail := func(l db.Lease, gen int64) error {
		_, err := db.FailLease(ctx, f.pool, l.ID, gen, "broken")
		return err
	}
	markOK := func(l db.Lease, gen int64) error {
		_, err := db.MarkLeaseCleanup(ctx, f.pool, l.ID, gen, true, "")
		return err
	}
	setRef := func(l db.Lease, gen int64) error {
		_, err := db.SetLeaseProviderRef(ctx, f.pool, l.ID, gen, "sandbox-1")
		return err
	}
	del := func(l db.Lease, gen int64) error { return db.DeleteLease(ctx, f.pool, l.ID, gen) }
	// takeover has a retried attempt of the same run adopt l: the first attempt's generation is stale.
	takeover := func(t *testing.T, l db.Lease) (db.Lease, int64) {
		t.Helper()
		adopted, err := db.AcquireLease(ctx, f.pool, f.request(0, slices.Index(f.ws, l.ExecutionWorkspaceID), 0))
		if err != nil || adopted.ID != l.ID {
			t.Fatalf("takeover: %v %+v", err, adopted)
		}
		return adopted, l.Generation
	}
	cases := []struct {
		name string
		op   string // as recorded in the audit event
		// setup leaves the lease in the state under test and returns it with the generation to present
		setup func(t *testing.T, l db.Lease) (db.Lease, int64)
		write func(l db.Lease, gen int64) error
	}{
		{"heartbeat after takeover", "heartbeat", takeover, heartbeat},
		{"release after takeover", "release", takeover, release},
		{"fail after takeover", "fail", takeover, fail},
		{"provider ref after takeover", "set provider ref", takeover, setRef},
		{"heartbeat after expiry", "heartbeat",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return expire(t, l), l.Generation }, heartbeat},
		{"heartbeat after release", "heartbeat",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				if err := release(l, l.Generation); err != nil {
					t.Fatal(err)
				}
				return l, l.Generation
			}, heartbeat},
		{"release after force release", "release",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				forced, err := db.ForceReleaseLease(ctx, f.pool, f.company, l.ID)
				if err != nil {
					t.Fatal(err)
				}
				return forced, l.Generation
			}, release},
		{"release twice", "release",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				if err := release(l, l.Generation); err != nil {
					t.Fatal(err)
				}
				return l, l.Generation
			}, release},
		{"fail after expiry", "fail",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return expire(t, l), l.Generation }, fail},
		{"provider ref after expiry", "set provider ref",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return expire(t, l), l.Generation }, setRef},
		{"cleanup mark with the pre-expiry generation", "mark cleanup",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return expire(t, l), l.Generation }, markOK},
		{"cleanup mark on a live lease", "mark cleanup",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return l, l.Generation }, markOK},
		{"cleanup mark after success", "mark cleanup",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				if err := release(l, l.Generation); err != nil {
					t.Fatal(err)
				}
				if err := markOK(l, l.Generation); err != nil {
					t.Fatal(err)
				}
				return l, l.Generation
			}, markOK},
		{"delete with the pre-expiry generation", "delete",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				e := expire(t, l)
				if err := markOK(e, e.Generation); err != nil {
					t.Fatal(err)
				}
				return e, l.Generation
			}, del},
		{"delete a live lease", "delete",
			func(t *testing.T, l db.Lease) (db.Lease, int64) { return l, l.Generation }, del},
		{"delete before cleanup", "delete",
			func(t *testing.T, l db.Lease) (db.Lease, int64) {
				if err := release(l, l.Generation); err != nil {
					t.Fatal(err)
				}
				return l, l.Generation
			}, del},
	}
	if len(cases)+1 > len(f.ws) {
		t.Fatalf("%d cases, %d workspaces", len(cases), len(f.ws))
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, gen := tc.setup(t, f.acquire(t, 0, i, 0))
			before := f.row(t, l.ID)
			events := len(f.fencedEvents(t, l.ID))
			err := tc.write(l, gen)
			if !errors.Is(err, db.ErrFenced) {
				t.Fatalf("write: %v, want ErrFenced", err)
			}
			if after := f.row(t, l.ID); after != before {
				t.Fatalf("fenced write changed the row:\nbefore %s\nafter  %s", before, after)
			}
			got := f.fencedEvents(t, l.ID)
			if len(got) != events+1 {
				t.Fatalf("%d lease.fenced events, want %d", len(got), events+1)
			}
			var stored db.Lease
			if stored, err = db.LeaseByID(ctx, f.pool, f.company, l.ID); err != nil {
				t.Fatal(err)
			}
			d := got[len(got)-1]
			if d["op"] != tc.op || d["presented_generation"] != float64(gen) ||
				d["current_generation"] != float64(stored.Generation) || d["current_status"] != stored.Status {
				t.Fatalf("audit details %v; want op %q, presented %d, current %d %s", d, tc.op, gen,
					stored.Generation, stored.Status)
			}
		})
	}
	// The same writes with the current generation, from the right status, go through.
	t.Run("current generation", func(t *testing.T) {
		l := f.acquire(t, 0, len(cases), 0)
		if _, err := db.HeartbeatLease(ctx, f.pool, l.ID, l.Generation, time.Minute); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		e := expire(t, l)
		if _, err := db.MarkLeaseCleanup(ctx, f.pool, e.ID, e.Generation, true, ""); err != nil {
			t.Fatalf("mark: %v", err)
		}
		if err := db.DeleteLease(ctx, f.pool, e.ID, e.Generation); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if f.row(t, l.ID) != "" {
			t.Fatal("deleted lease still stored")
		}
		if err := db.DeleteLease(ctx, f.pool, e.ID, e.Generation); !errors.Is(err, db.ErrFenced) {
			t.Fatalf("delete again: %v, want ErrFenced", err)
		}
	})
}

// TestLeaseExpiryDatabaseClock: expiry is decided by the database clock alone. A lease whose
// expires_at passed is expired once, at generation + 1, with cleanup pending; one still in the
// future is left alone; the old holder's heartbeat is then fenced, and the workspace can be leased
// again.
func TestLeaseExpiryDatabaseClock(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 1, 2, 2)
	ctx := context.Background()
	l := f.acquire(t, 0, 0, 0)
	keep := f.acquire(t, 0, 1, 1)
	if l.AcquiredAt == nil || l.ExpiresAt == nil || l.ExpiresAt.Sub(*l.AcquiredAt) != time.Hour ||
		!l.HeartbeatAt.Equal(*l.AcquiredAt) {
		t.Fatalf("acquired_at %v heartbeat_at %v expires_at %v; want expires one hour after acquisition",
			l.AcquiredAt, l.HeartbeatAt, l.ExpiresAt)
	}
	if got, err := db.ExpireLeases(ctx, f.pool, 10); err != nil || len(got) != 0 {
		t.Fatalf("expired fresh leases: %v %+v", err, got)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() - interval '1 second'
		WHERE id = $1`, l.ID); err != nil {
		t.Fatal(err)
	}
	keepBefore := f.row(t, keep.ID)
	got, err := db.ExpireLeases(ctx, f.pool, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("expire: %v %+v", err, got)
	}
	e := got[0]
	if e.ID != l.ID || e.Status != db.LeaseExpired || e.Generation != l.Generation+1 ||
		e.CleanupStatus != db.LeaseCleanupPending || e.ReleasedAt == nil || e.FailureReason == "" {
		t.Fatalf("expired lease %+v", e)
	}
	if f.row(t, keep.ID) != keepBefore {
		t.Fatal("a lease that had not expired was touched")
	}
	if _, err := db.HeartbeatLease(ctx, f.pool, l.ID, l.Generation, time.Hour); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("old holder's heartbeat: %v, want ErrFenced", err)
	}
	if again, err := db.ExpireLeases(ctx, f.pool, 10); err != nil || len(again) != 0 {
		t.Fatalf("second sweep: %v %+v", err, again)
	}
	next := f.acquire(t, 0, 0, 1)
	if next.ID == l.ID || next.Generation != 1 {
		t.Fatalf("re-acquired %+v", next)
	}
	// A heartbeat pushes expires_at forward from the database's now().
	hb, err := db.HeartbeatLease(ctx, f.pool, keep.ID, keep.Generation, 2*time.Hour)
	if err != nil || hb.HeartbeatAt == nil || hb.ExpiresAt.Sub(*hb.HeartbeatAt) != 2*time.Hour ||
		!hb.HeartbeatAt.After(*keep.HeartbeatAt) || hb.HeartbeatAge() < 0 {
		t.Fatalf("heartbeat: %v %+v", err, hb)
	}
}

// TestLeaseExpireConcurrent: several sweepers expiring the same due leases at once claim each
// lease exactly once (generation bumped once, returned to one sweeper) and leave none behind.
func TestLeaseExpireConcurrent(t *testing.T) {
	t.Parallel()
	const n = 200
	f := setupLeases(t, 1, n, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for w := range n {
		f.acquire(t, 0, w, -1)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	const sweepers = 4
	got := make([][]db.Lease, sweepers)
	errs := make([]error, sweepers)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for s := range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for {
				batch, err := db.ExpireLeases(ctx, f.pool, 7)
				if err != nil || len(batch) == 0 {
					errs[s] = err
					return
				}
				got[s] = append(got[s], batch...)
			}
		}()
	}
	close(gate)
	wg.Wait()
	seen := map[string]int{}
	for s := range sweepers {
		if errs[s] != nil {
			t.Fatalf("sweeper %d: %v", s, errs[s])
		}
		for _, l := range got[s] {
			seen[l.ID]++
			if l.Generation != 2 || l.Status != db.LeaseExpired {
				t.Fatalf("sweeper %d returned %+v", s, l)
			}
		}
		t.Logf("sweeper %d expired %d", s, len(got[s]))
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("lease %s expired %d times", id, k)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d leases expired, want %d", len(seen), n)
	}
	var expired, gen2 int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'expired'),
		count(*) FILTER (WHERE generation = 2) FROM environment_leases`).Scan(&expired, &gen2); err != nil {
		t.Fatal(err)
	}
	if expired != n || gen2 != n {
		t.Fatalf("%d expired, %d at generation 2; want %d", expired, gen2, n)
	}
}

// TestLeaseAcquireRules: acquiring again for the same run adopts its live lease; anyone else is
// busy until it ends; foreign, archived, closing and malformed targets are refused without a row.
func TestLeaseAcquireRules(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 2, 3, 2)
	ctx := context.Background()
	first := f.acquire(t, 0, 0, 0)
	if first.Status != db.LeaseActive || first.Generation != 1 || first.RunID != f.runs[0] ||
		first.TaskID != f.tasks[0] || first.CleanupStatus != db.LeaseCleanupNone || !first.Live() {
		t.Fatalf("acquired %+v", first)
	}
	// A retried attempt of the same run takes the lease over: same row, next generation, and the
	// first attempt is fenced out.
	again := f.acquire(t, 0, 0, 0)
	if again.ID != first.ID || again.Generation != first.Generation+1 || !again.ExpiresAt.After(*first.ExpiresAt) {
		t.Fatalf("same run got %s gen %d expiring %v, want its lease %s at gen %d with a later expiry",
			again.ID, again.Generation, again.ExpiresAt, first.ID, first.Generation+1)
	}
	if _, err := db.HeartbeatLease(ctx, f.pool, first.ID, first.Generation, time.Hour); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("first attempt's heartbeat after the takeover: %v, want ErrFenced", err)
	}
	first = again
	for _, r := range []int{1, -1} {
		if _, err := db.AcquireLease(ctx, f.pool, f.request(0, 0, r)); !errors.Is(err, db.ErrLeaseBusy) {
			t.Fatalf("run %d while held: %v, want ErrLeaseBusy", r, err)
		}
	}
	// Other environment, other workspace: separate slots.
	f.acquire(t, 1, 0, 1)
	f.acquire(t, 0, 1, 1)
	if _, err := db.ReleaseLease(ctx, f.pool, first, "done"); err != nil {
		t.Fatal(err)
	}
	if next := f.acquire(t, 0, 0, 1); next.ID == first.ID {
		t.Fatal("a released lease was handed out again")
	}

	other := addLeaseCompany(t, f.pool, "other", 1, 1, 0)
	var count int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM environment_leases`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE environments SET status = 'archived' WHERE id = $1`, f.envs[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE execution_workspaces SET status = 'closing' WHERE id = $1`, f.ws[2]); err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		name string
		req  func() db.LeaseRequest
		want error
	}{
		{"another company's environment", func() db.LeaseRequest {
			r := f.request(0, 2, 0)
			r.EnvironmentID = other.envs[0]
			return r
		}, db.ErrNotFound},
		{"another company's workspace", func() db.LeaseRequest {
			r := f.request(0, 0, 0)
			r.ExecutionWorkspaceID = other.ws[0]
			return r
		}, db.ErrNotFound},
		{"as another company", func() db.LeaseRequest {
			r := f.request(0, 2, 0)
			r.CompanyID = other.company
			return r
		}, db.ErrNotFound},
		{"archived environment", func() db.LeaseRequest { return f.request(1, 1, 0) }, db.ErrLeaseUnavailable},
		{"closing workspace", func() db.LeaseRequest { return f.request(0, 2, 0) }, db.ErrLeaseUnavailable},
		{"malformed id", func() db.LeaseRequest {
			r := f.request(0, 2, 0)
			r.RunID = "run-1"
			return r
		}, db.ErrInvalidID},
		{"no ttl", func() db.LeaseRequest {
			r := f.request(0, 2, 0)
			r.TTL = 0
			return r
		}, nil},
	}
	for _, tc := range refused {
		_, err := db.AcquireLease(ctx, f.pool, tc.req())
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	var after int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM environment_leases`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != count {
		t.Fatalf("refused acquisitions wrote %d rows", after-count)
	}
}

// TestLeaseForceReleaseAndRetryCleanup: an administrator's release ends a live lease and fences
// its holder; cleanup failures are recorded and counted, retry puts them back to pending, and both
// actions refuse leases in other states or of other companies.
func TestLeaseForceReleaseAndRetryCleanup(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 1, 1, 1)
	ctx := context.Background()
	other := addLeaseCompany(t, f.pool, "other", 1, 1, 0).company
	l := f.acquire(t, 0, 0, 0)
	if _, err := db.ForceReleaseLease(ctx, f.pool, other, l.ID); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("force release as another company: %v, want ErrNotFound", err)
	}
	if _, err := db.RetryLeaseCleanup(ctx, f.pool, f.company, l.ID); !errors.Is(err, db.ErrLeaseState) {
		t.Fatalf("retry cleanup of a live lease: %v, want ErrLeaseState", err)
	}
	forced, err := db.ForceReleaseLease(ctx, f.pool, f.company, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if forced.Status != db.LeaseReleased || forced.Generation != l.Generation+1 || forced.ReleasedAt == nil ||
		forced.CleanupStatus != db.LeaseCleanupPending || forced.Live() {
		t.Fatalf("force released %+v", forced)
	}
	if _, err := db.HeartbeatLease(ctx, f.pool, l.ID, l.Generation, time.Hour); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("holder's heartbeat after force release: %v, want ErrFenced", err)
	}
	if _, err := db.ForceReleaseLease(ctx, f.pool, f.company, l.ID); !errors.Is(err, db.ErrLeaseState) {
		t.Fatalf("force release twice: %v, want ErrLeaseState", err)
	}
	failed, err := db.MarkLeaseCleanup(ctx, f.pool, l.ID, forced.Generation, false, "sandbox busy")
	if err != nil || failed.CleanupStatus != db.LeaseCleanupFailed || failed.CleanupAttempts != 1 ||
		failed.FailureReason != "sandbox busy" {
		t.Fatalf("cleanup failure: %v %+v", err, failed)
	}
	// A retried cleanup job may mark again after a failure.
	failed, err = db.MarkLeaseCleanup(ctx, f.pool, l.ID, forced.Generation, false, "sandbox still busy")
	if err != nil || failed.CleanupAttempts != 2 {
		t.Fatalf("second cleanup failure: %v %+v", err, failed)
	}
	if _, err := db.RetryLeaseCleanup(ctx, f.pool, other, l.ID); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("retry as another company: %v, want ErrNotFound", err)
	}
	retried, err := db.RetryLeaseCleanup(ctx, f.pool, f.company, l.ID)
	if err != nil || retried.CleanupStatus != db.LeaseCleanupPending || retried.CleanupAttempts != 2 ||
		retried.Generation != forced.Generation {
		t.Fatalf("retry cleanup: %v %+v", err, retried)
	}
	if _, err := db.RetryLeaseCleanup(ctx, f.pool, f.company, l.ID); !errors.Is(err, db.ErrLeaseState) {
		t.Fatalf("retry a pending cleanup: %v, want ErrLeaseState", err)
	}
	done, err := db.MarkLeaseCleanup(ctx, f.pool, l.ID, retried.Generation, true, "")
	if err != nil || done.CleanupStatus != db.LeaseCleanupSucceeded || done.CleanupAttempts != 3 {
		t.Fatalf("cleanup success: %v %+v", err, done)
	}
}

// TestListLeases: filters by status (one, or "live") and environment, keyset pages in a stable
// newest-first order with no gaps or repeats, and never shows another company's leases.
func TestListLeases(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 2, 4, 1)
	ctx := context.Background()
	other := addLeaseCompany(t, f.pool, "other", 1, 1, 0)
	var all []db.Lease // oldest first
	for e := range 2 {
		for w := range 4 {
			l := f.acquire(t, e, w, -1)
			if w%2 == 1 {
				var err error
				if l, err = db.ReleaseLease(ctx, f.pool, l, "done"); err != nil {
					t.Fatal(err)
				}
			}
			all = append(all, l)
		}
	}
	foreign, err := db.AcquireLease(ctx, f.pool, other.request(0, 0, -1))
	if err != nil {
		t.Fatal(err)
	}

	ids := func(ls []db.Lease) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = l.ID
		}
		return out
	}
	want := func(keep func(db.Lease) bool) []string {
		var out []string
		for i := len(all) - 1; i >= 0; i-- {
			if keep(all[i]) {
				out = append(out, all[i].ID)
			}
		}
		return out
	}
	cases := []struct {
		name   string
		filter db.LeaseFilter
		want   []string
	}{
		{"all", db.LeaseFilter{}, want(func(db.Lease) bool { return true })},
		{"active", db.LeaseFilter{Status: db.LeaseActive}, want(func(l db.Lease) bool { return l.Status == db.LeaseActive })},
		{"live", db.LeaseFilter{Status: "live"}, want(func(l db.Lease) bool { return l.Live() })},
		{"released", db.LeaseFilter{Status: db.LeaseReleased}, want(func(l db.Lease) bool { return l.Status == db.LeaseReleased })},
		{"expired", db.LeaseFilter{Status: db.LeaseExpired}, nil},
		{"environment", db.LeaseFilter{EnvironmentID: f.envs[1]}, want(func(l db.Lease) bool { return l.EnvironmentID == f.envs[1] })},
		{"environment and status", db.LeaseFilter{EnvironmentID: f.envs[0], Status: db.LeaseReleased},
			want(func(l db.Lease) bool { return l.EnvironmentID == f.envs[0] && l.Status == db.LeaseReleased })},
		{"another company's environment", db.LeaseFilter{EnvironmentID: other.envs[0]}, nil},
	}
	for _, tc := range cases {
		for _, limit := range []int{0, 3} {
			var got []db.Lease
			filter := tc.filter
			filter.Limit = limit
			for page := 0; ; page++ {
				ls, err := db.ListLeases(ctx, f.pool, f.company, filter)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if page > len(all) {
					t.Fatalf("%s: pagination does not end", tc.name)
				}
				got = append(got, ls...)
				if limit == 0 || len(ls) < limit {
					break
				}
				filter.After = ls[len(ls)-1].Cursor()
			}
			if g := ids(got); !slices.Equal(g, tc.want) {
				t.Errorf("%s (limit %d): got %v, want %v", tc.name, limit, g, tc.want)
			}
		}
	}
	if _, err := db.LeaseByID(ctx, f.pool, f.company, foreign.ID); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's lease by id: %v, want ErrNotFound", err)
	}
	got, err := db.LeaseByID(ctx, f.pool, f.company, all[0].ID)
	if err != nil || got.ID != all[0].ID || got.HeartbeatAge() < 0 || got.ReadAt.Before(*got.HeartbeatAt) {
		t.Fatalf("lease by id: %v %+v", err, got)
	}
	if _, err := db.ListLeases(ctx, f.pool, f.company, db.LeaseFilter{EnvironmentID: "nope"}); !errors.Is(err, db.ErrInvalidID) {
		t.Fatalf("malformed environment filter: %v, want ErrInvalidID", err)
	}
}

// TestLeaseAcquireWaitsForArchiveAndClose: an acquisition that meets an environment being archived
// (locked by LockEnvironment) or a workspace being closed (a status update in flight) waits for
// that transaction and then sees its outcome, so no lease is granted on an archived environment
// or a closing workspace however the two interleave.
func TestLeaseAcquireWaitsForArchiveAndClose(t *testing.T) {
	t.Parallel()
	f := setupLeases(t, 2, 2, 1)
	cases := []struct {
		name  string
		req   db.LeaseRequest
		begin func(ctx context.Context, tx pgx.Tx) error // takes the lock and changes the status
	}{
		{"archive", f.request(1, 0, 0), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := db.LockEnvironment(ctx, tx, f.company, f.envs[1]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE environments SET status = 'archived' WHERE id = $1`, f.envs[1])
			return err
		}},
		{"close", f.request(0, 1, 0), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE execution_workspaces SET status = 'closing' WHERE id = $1`, f.ws[1])
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
			if err := tc.begin(ctx, tx); err != nil {
				t.Fatal(err)
			}
			var holder int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := db.AcquireLease(ctx, f.pool, tc.req)
				done <- err
			}()
			// Wait until the acquisition is blocked behind the open transaction.
			for {
				var blocked bool
				if err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
					WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE 'INSERT INTO environment_leases%')`,
					holder).Scan(&blocked); err != nil {
					t.Fatalf("waiting for the acquisition to block: %v", err)
				}
				if blocked {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("acquisition did not wait for the open transaction: %v", err)
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, db.ErrLeaseUnavailable) {
					t.Fatalf("acquire after the change committed: %v, want ErrLeaseUnavailable", err)
				}
			case <-ctx.Done():
				t.Fatal("acquisition still blocked after the commit")
			}
		})
	}
}
