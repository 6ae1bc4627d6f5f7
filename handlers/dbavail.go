package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"berth/db"
)

// While the database is down or every pooled connection is taken, Berth says so instead of
// failing with 500 (DESIGN §10): 503 database_unavailable or database_busy with Retry-After,
// as JSON on the API and as an error page for browsers. The health endpoint checks over a
// connection of its own and is answered before the session middleware, so neither a dead
// pool nor an exhausted one can stall it.

const (
	// retryUnavailable is the Retry-After of database_unavailable: a supervised embedded
	// PostgreSQL is back within seconds.
	retryUnavailable = 5
	// retryBusy is the Retry-After of database_busy.
	retryBusy = 2
	// reachableTimeout bounds the probe that tells an outage from a bug for an error that
	// db.Unavailable does not recognize.
	reachableTimeout = time.Second
)

var (
	errDatabaseUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "database_unavailable",
		Message:    "Berth's database is not answering; Berth reconnects by itself. Try again in a few seconds.",
		RetryAfter: retryUnavailable}
	errDatabaseBusy = &httpError{Status: http.StatusServiceUnavailable, Code: "database_busy",
		Message: "Every database connection stayed busy for " + strconv.Itoa(int(db.AcquireTimeout/time.Second)) +
			" s. Try again in a moment.", RetryAfter: retryBusy}
)

type proberKey struct{}

// databaseAware sits outside the session middleware: it marks every request's context so that
// a pool acquire that times out is recognizable (db.WatchAcquire), and answers GET /api/health
// itself with a prober that owns a dedicated connection.
func (s *Server) databaseAware(next http.Handler) http.Handler {
	prober := db.NewProber(s.pool)
	s.prober = prober // Close closes its connection
	health := s.handle(s.health)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := db.WatchAcquire(context.WithValue(r.Context(), proberKey{}, prober))
		r = r.WithContext(ctx)
		if r.URL.Path == "/api/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			health.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// databaseError turns an error caused by the database's state into its 503, and returns any
// other error unchanged. An error nobody recognized is checked against a fresh connection
// first, so that an outage's odd symptoms still answer 503 while a real bug stays a 500.
func (s *Server) databaseError(r *http.Request, err error) error {
	var he *httpError
	switch {
	case errors.As(err, &he), errors.Is(err, db.ErrNotFound), errors.Is(err, db.ErrConflict):
		return err
	case db.Unavailable(err):
		return errDatabaseUnavailable
	case db.AcquireTimedOut(r.Context()) && errors.Is(err, context.DeadlineExceeded):
		return errDatabaseBusy
	case r.Context().Err() != nil:
		return err // the client went away; nothing to learn
	}
	if rerr := db.Reachable(r.Context(), s.pool, reachableTimeout); rerr != nil {
		s.log.WarnContext(r.Context(), "request failed while the database is unreachable", "method", r.Method,
			"path", r.URL.Path, "request_id", requestID(r.Context()), "err", err, "probe", rerr)
		return errDatabaseUnavailable
	}
	return err
}
