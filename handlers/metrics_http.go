package handlers

import (
	"net/http"
	"time"
)

// routeUnmatched is the route label of a request no specific pattern serves: no pattern at all,
// or one of the table's catch-all 404 patterns.
const routeUnmatched = "unmatched"

// instrument observes every request in berth_http_request_duration_seconds. The route label is
// the route table's pattern that serves the request ("GET /api/me"), looked up in mux, never the
// raw path, so the series stay as few as the routes; a request refused before the mux (401,
// cross-origin 403) still counts under its pattern. Methods outside the standard set are "other".
// A WebSocket upgrade counts as 101 with its whole connection time.
func (s *Server) instrument(routes, next http.Handler) http.Handler {
	mux, ok := routes.(interface {
		Handler(*http.Request) (http.Handler, string)
	})
	if !ok {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		_, route := mux.Handler(r)
		if route == "" || route == "/" || route == "/api/" {
			route = routeUnmatched
		}
		code := rec.status
		if code == 0 {
			code = http.StatusOK // nothing written: net/http sends 200
			if r.Header.Get("Upgrade") != "" {
				code = http.StatusSwitchingProtocols // hijacked
			}
		}
		s.metrics.ObserveRequest(route, metricMethod(r.Method), code, time.Since(start))
	})
}

// metricMethod keeps the method label to the standard methods.
func metricMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}
