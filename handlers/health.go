package handlers

import (
	"context"
	"net/http"
	"time"
)

// health reports whether this process can reach its database; load balancers poll it.
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var one int
	if err := s.pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "degraded", "database": "unreachable", "version": s.version})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "database": "ok", "version": s.version})
	return nil
}
