package handlers

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"berth/db"
)

// healthTimeout keeps the health answer under a second, whatever the database does.
const healthTimeout = 900 * time.Millisecond

// health reports whether this process can reach its database; load balancers poll it. It
// checks over the prober's dedicated connection (never the pool, see databaseAware), so it
// answers within a second even while every pooled connection is taken: 200 ok, or 503
// degraded with Retry-After while the database does not answer.
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	var err error
	if p, ok := r.Context().Value(proberKey{}).(*db.Prober); ok {
		err = p.Check(ctx)
	} else {
		err = db.Reachable(ctx, s.pool, healthTimeout)
	}
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(retryUnavailable))
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "degraded", "database": "unreachable", "version": s.version})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "database": "ok", "version": s.version})
	return nil
}
