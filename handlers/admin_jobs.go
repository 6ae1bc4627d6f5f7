package handlers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"riverqueue.com/riverui"

	"berth/db"
	"berth/views"
)

// adminJobsPrefix is where the River UI is mounted.
const adminJobsPrefix = "/admin/jobs"

// NewJobsUI builds the River UI over client, for Deps.JobsUI, and runs its background services
// until ctx ends (cmd/berth passes the serve context, so they stop with the process). The UI has
// no authentication of its own: routes.go mounts it behind an instance-admin session.
func NewJobsUI(ctx context.Context, client *river.Client[pgx.Tx], log *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    log.With("component", "riverui"),
		Prefix:    adminJobsPrefix,
	})
	if err != nil {
		return nil, fmt.Errorf("river ui: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("river ui: start: %w", err)
	}
	return h, nil
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
