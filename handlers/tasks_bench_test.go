package handlers

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db/dbtest"
)

// benchTasks is how many tasks the benchmark project holds.
const benchTasks = 10000

// taskQueryCounter is a pgx tracer that counts the statements a pool sends (pool pings excluded).
type taskQueryCounter struct{ n atomic.Int64 }

// TraceQueryStart counts one statement.
func (c *taskQueryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if data.SQL != "-- ping" {
		c.n.Add(1)
	}
	return ctx
}

// TraceQueryEnd is required by pgx.QueryTracer.
func (c *taskQueryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// benchTaskWorld is a task world on a traced pool whose project holds benchTasks tasks; the
// task PRJ-5000 has a reuse binding, so its plan reads every part of the snapshot.
func benchTaskWorld(b *testing.B) (*taskWorld, *taskQueryCounter, string) {
	b.Helper()
	ctx := context.Background()
	counter := &taskQueryCounter{}
	cfg, err := pgxpool.ParseConfig(dbtest.ConnString(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	e := setup(b, func(d *Deps) {
		d.Pool = pool
	})
	e.pool = pool
	w := newTaskWorldOn(e)
	w.setPolicy(`{"allow_task_override":true}`)
	w.exec(`INSERT INTO tasks (company_id, project_id, number, key, title, description, command, status, trust, workspace_mode)
		SELECT $1, $2, i, 'PRJ-' || i, 'Task number ' || i, repeat('Some description. ', 20), 'make test',
			(ARRAY['todo', 'in_progress', 'in_review', 'done', 'cancelled'])[1 + i % 5],
			CASE WHEN i % 7 = 0 THEN 'low' ELSE 'standard' END, 'inherit'
		FROM generate_series(1, $3::int) i`, w.r.A.ID, w.ProjectID, benchTasks)
	w.exec(`UPDATE projects SET next_task_number = $2 WHERE id = $1`, w.ProjectID, benchTasks+1)
	w.exec(`ANALYZE tasks`)
	var taskID string
	if err := pool.QueryRow(ctx, `SELECT id FROM tasks WHERE project_id = $1 AND number = 5000`, w.ProjectID).Scan(&taskID); err != nil {
		b.Fatal(err)
	}
	ws := w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
	w.putBinding(taskID, map[string]any{"mode": "reuse", "execution_workspace_id": ws, "revision": 0, "request_key": "bench"}, http.StatusOK)
	return w, counter, taskID
}

// benchTaskGet measures b.N sequential GETs over loopback and reports p50, p99 and the statements
// the server sent per request.
func benchTaskGet(b *testing.B, client *http.Client, counter *taskQueryCounter, url string, header http.Header) {
	b.Helper()
	get := func() time.Duration {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header = header.Clone()
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s = %d", url, resp.StatusCode)
		}
		return time.Since(start)
	}
	for i := 0; i < 20; i++ {
		get()
	}
	durations := make([]time.Duration, 0, b.N)
	counter.n.Store(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		durations = append(durations, get())
	}
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "queries/op")
	reportLatency(b, durations)
}

// BenchmarkTaskListPage measures GET /projects/{id}/tasks (the first page of 50 of 10,000 tasks,
// and a filtered page) as a signed-in board member.
func BenchmarkTaskListPage(b *testing.B) {
	w, counter, _ := benchTaskWorld(b)
	client := w.e.browser(w.r.Board)
	base := w.e.ts.URL + "/projects/" + w.ProjectID + "/tasks"
	b.Run("first-page", func(b *testing.B) { benchTaskGet(b, client, counter, base, http.Header{}) })
	b.Run("filtered", func(b *testing.B) {
		benchTaskGet(b, client, counter, base+"?status=todo,done&trust=standard&q=number+12", http.Header{})
	})
	b.Run("htmx-fragment", func(b *testing.B) { benchTaskGet(b, client, counter, base, http.Header{"Hx-Request": {"true"}}) })
}

// BenchmarkPlanAPI measures GET /api/tasks/{id}/plan with a bearer token, in a project of
// 10,000 tasks, for a task bound to a workspace.
func BenchmarkPlanAPI(b *testing.B) {
	w, counter, taskID := benchTaskWorld(b)
	benchTaskGet(b, &http.Client{}, counter, w.e.ts.URL+"/api/tasks/"+taskID+"/plan",
		http.Header{"Authorization": {"Bearer " + w.r.Board.Token}})
}

// BenchmarkTaskPage measures GET /tasks/{id} (details, plan, binding and edit form) as a
// signed-in board member.
func BenchmarkTaskPage(b *testing.B) {
	w, counter, taskID := benchTaskWorld(b)
	benchTaskGet(b, w.e.browser(w.r.Board), counter, w.e.ts.URL+"/tasks/"+taskID, http.Header{})
}
