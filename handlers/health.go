package handlers

import (
	"context"
	"net/http"
	"time"

	"berth/db"
)

// health reports whether this process can reach its database; load balancers poll it.
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := db.Ping(ctx, s.pool); err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "degraded", "database": "unreachable", "version": s.version})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "database": "ok", "version": s.version})
	return nil
}
