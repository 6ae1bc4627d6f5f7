package jobs

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"berth/db"
)

// fullPassEvery is how often each periodic recovery job runs whatever the database says: the
// passes also tidy this node's disk (scratch layers, import staging, the unmanaged report) and
// prune old tokens, which no row announces.
const fullPassEvery = 10 * time.Minute

// PeriodicJobs is the schedule the elected leader enqueues. The recovery kinds are asked first
// (periodicGate): a job's insert, fetch and completion cost the database more than one question,
// and on an idle server the answer is almost always "nothing to do" (BenchmarkIdleServer). No
// job has a PeriodicJobOpts.ID: with open-source River an ID only makes every tick open and
// commit an empty transaction (the durable schedule it upserts is River Pro's).
func PeriodicJobs(d Deps) []*river.PeriodicJob {
	g := &periodicGate{q: d.Pool, memo: d.Recovery, log: d.Log, last: map[string]time.Time{}}
	gated := func(args river.JobArgs, due func(db.RecoveryDue) bool) func() (river.JobArgs, *river.InsertOpts) {
		return func() (river.JobArgs, *river.InsertOpts) {
			if !g.wants(args.Kind(), due) {
				return nil, nil // River skips this tick
			}
			return args, nil
		}
	}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(HousekeepingInterval),
			func() (river.JobArgs, *river.InsertOpts) { return HousekeepingArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
		// Recovery (sweep.go, leases.go); a restarting node also sweeps once directly.
		river.NewPeriodicJob(river.PeriodicInterval(SweepInterval),
			gated(SweepOrphansArgs{}, func(d db.RecoveryDue) bool { return d.Live }),
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(ExpireLeasesInterval),
			gated(ExpireLeasesArgs{}, func(d db.RecoveryDue) bool { return d.Leases }),
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(ExpireSetupSessionsInterval),
			gated(ExpireSetupSessionsArgs{}, func(d db.RecoveryDue) bool { return d.SetupSessions }),
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
}

// periodicGate decides on the leader whether a periodic recovery job is worth enqueueing: when
// its kind has not run for fullPassEvery, or when db.RecoveryDue says it has work: the answer
// this node's last heartbeat gave (memo) while it holds, else db.RecoveryDueNow. One answer
// serves every kind due in the same second (their schedules line up: 15 s and 30 s from the
// same start). If the database does not answer, the job is enqueued and its own queries decide.
type periodicGate struct {
	q    db.Querier
	memo *db.RecoveryMemo
	log  *slog.Logger

	mu    sync.Mutex
	asked time.Time
	due   db.RecoveryDue
	last  map[string]time.Time // when each kind was last let through
}

// wants reports whether kind should be enqueued now; due picks its flag from the answer.
func (g *periodicGate) wants(kind string, due func(db.RecoveryDue) bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if now.Sub(g.last[kind]) >= fullPassEvery {
		g.last[kind] = now
		return true
	}
	if d, ok := g.memo.Fresh(now); ok {
		g.due, g.asked = d, now
	}
	if now.Sub(g.asked) > time.Second {
		// River calls this from its periodic enqueuer, which must not block for long.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		d, err := db.RecoveryDueNow(ctx, g.q)
		cancel()
		if err != nil {
			if g.log != nil {
				g.log.Warn("periodic recovery check; enqueueing anyway", "kind", kind, "err", err)
			}
			g.last[kind] = now
			return true
		}
		g.due, g.asked = d, now
	}
	if due(g.due) {
		g.last[kind] = now
		return true
	}
	return false
}

// riverLogger is the logger River gets: d.Log's, with River's note that a periodic job's
// constructor returned nothing (periodicGate's answer on every idle tick) demoted to debug.
func riverLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return slog.New(quietSkips{l.With("component", "river").Handler()})
}

// quietSkips demotes River's periodic-skip record to debug and passes every other one on.
type quietSkips struct{ slog.Handler }

// Enabled lets an info record through to Handle, which decides once it has the message.
func (h quietSkips) Enabled(ctx context.Context, level slog.Level) bool {
	return h.Handler.Enabled(ctx, level)
}

// Handle demotes the skip note.
func (h quietSkips) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && strings.Contains(r.Message, "nil returned from periodic job constructor") {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs keeps the demotion on the derived handler.
func (h quietSkips) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietSkips{h.Handler.WithAttrs(attrs)}
}

// WithGroup keeps the demotion on the derived handler.
func (h quietSkips) WithGroup(name string) slog.Handler { return quietSkips{h.Handler.WithGroup(name)} }
