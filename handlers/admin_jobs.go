package handlers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"riverqueue.com/riverui"

	"berth/db"
	"berth/views"
)

// adminJobsPrefix is where the River UI is mounted.
const adminJobsPrefix = "/admin/jobs"

// jobsUIIdle is how long the River UI's background services (its job-count caches, a query
// every 10 s each) keep running after the last request to it.
const jobsUIIdle = 5 * time.Minute

// NewJobsUI builds the River UI over client, for Deps.JobsUI. Its background services run only
// while the UI is in use: the first request starts them under ctx (cmd/berth passes the serve
// context, so they stop with the process) and they stop jobsUIIdle after the last one, so a
// server nobody administers does not count jobs every few seconds (BenchmarkIdleServer). The UI
// has no authentication of its own: routes.go mounts it behind an instance-admin session.
func NewJobsUI(ctx context.Context, client *river.Client[pgx.Tx], log *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    log.With("component", "riverui"),
		Prefix:    adminJobsPrefix,
	})
	if err != nil {
		return nil, fmt.Errorf("river ui: %w", err)
	}
	return &jobsUI{ui: h, ctx: ctx, log: log, idle: jobsUIIdle}, nil
}

// jobsUI starts the River UI's services on demand and stops them when it has been idle.
type jobsUI struct {
	ui   *riverui.Handler
	ctx  context.Context
	log  *slog.Logger
	idle time.Duration

	mu   sync.Mutex
	stop *time.Timer // running services' idle stop; nil while they are stopped
}

func (j *jobsUI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	j.touch()
	j.ui.ServeHTTP(w, r)
}

// touch starts the services if they are stopped and pushes their idle stop back.
func (j *jobsUI) touch() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stop != nil {
		j.stop.Reset(j.idle)
		return
	}
	ctx, cancel := context.WithCancel(j.ctx)
	if err := j.ui.Start(ctx); err != nil {
		cancel()
		j.log.Warn("river ui: start", "err", err) // the UI still answers, counting on demand
		return
	}
	j.stop = time.AfterFunc(j.idle, func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		j.stop = nil
		cancel()
	})
}

// adminJobs guards the River UI: an instance admin's session reaches it, anyone else gets the
// same 404 as for a page that does not exist; without a session, a browser goes to /login.
// routes.go mounts it at adminJobsPrefix.
func (s *Server) adminJobs(ui http.Handler) http.Handler {
	ui = s.withBackLink(ui)
	return s.page(func(w http.ResponseWriter, r *http.Request, p *principal) error {
		if !p.User.IsInstanceAdmin {
			return errNotFound
		}
		ui.ServeHTTP(w, r)
		return nil
	})
}

// unmanagedPage is GET /admin/workspaces (instance admins): the orphan sweep's latest report of
// unowned entries under each node's workspace base. Anyone else gets a 404.
func (s *Server) unmanagedPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !p.User.IsInstanceAdmin {
		return errNotFound
	}
	reports, err := db.LatestUnmanagedReports(r.Context(), s.pool)
	if err != nil {
		return err
	}
	rows := make([]views.UnmanagedRow, 0, len(reports))
	for _, u := range reports {
		rows = append(rows, views.UnmanagedRow{Node: u.Node, At: u.At, Unmanaged: u.Unmanaged, Unrecorded: u.Unrecorded})
	}
	return s.render(w, r, views.UnmanagedPage(s.frame(r, "Unmanaged directories", "admin-workspaces"), rows))
}
