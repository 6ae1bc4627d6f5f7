package handlers

import (
	"context"
	"fmt"
	"net/http"

	"riverqueue.com/riverui"
)

// adminJobsPrefix is where the River UI is mounted.
const adminJobsPrefix = "/admin/jobs"

// newJobsUI builds the River UI over the server's River client and starts its background
// services until ctx ends. The UI has no authentication of its own: adminRoutes puts it behind
// an instance-admin session.
func (s *Server) newJobsUI(ctx context.Context) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(s.jobs, nil),
		Logger:    s.log.With("component", "riverui"),
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

// adminRoutes mounts instance-admin tools: the River UI at /admin/jobs. Anyone else gets the same
// 404 as for a page that does not exist; without a session, a browser goes to /login.
func (s *Server) adminRoutes(mux *http.ServeMux, ui http.Handler) {
	if ui == nil {
		return
	}
	guard := s.page(func(w http.ResponseWriter, r *http.Request, p *principal) error {
		if !p.User.IsInstanceAdmin {
			return errNotFound
		}
		ui.ServeHTTP(w, r)
		return nil
	})
	mux.Handle(adminJobsPrefix, guard)
	mux.Handle(adminJobsPrefix+"/", guard)
}
