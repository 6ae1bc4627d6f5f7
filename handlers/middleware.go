package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"runtime/debug"
	"time"
)

type ctxKey int

const (
	requestIDKey ctxKey = iota
	principalKey
)

// middleware wraps the routes, outermost first: the client address, request id and logging,
// panic recovery, security headers, the Host check, cross-origin refusal, the session, then the
// caller's identity.
func (s *Server) middleware(h http.Handler) http.Handler {
	routes := h
	h = s.metricsAuth(s.identify(h)) // metrics.go: the metrics token never reaches identify
	h = s.sessions.LoadAndSave(h)
	h = s.databaseAware(h) // dbavail.go: pool-timeout tracking; /api/health on its own connection
	h = s.crossOrigin(h)
	h = s.hostCheck(h)
	h = s.securityHeaders(h)
	h = s.recoverPanics(h)
	h = s.logRequests(h)
	h = s.clientAddress(h)
	h = s.instrument(routes, h) // metrics_http.go: every request, by its route pattern
	return h
}

// statusRecorder remembers the status and size of a response for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer (flush, hijack for WebSockets).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// logRequests logs one line per request: never the query string, headers, cookies or tokens.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := newRequestID()
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		attrs := []any{"method", r.Method, "path", r.URL.Path, "status", rec.status, "bytes", rec.bytes,
			"duration_ms", float64(time.Since(start).Microseconds()) / 1000, "request_id", id, "remote", clientIP(r)}
		if p := principalFrom(r.Context()); p != nil {
			if p.Run != nil {
				attrs = append(attrs, "run_id", p.Run.ID, "task_id", p.Run.TaskID, "company_id", p.Run.Company.ID)
			} else {
				attrs = append(attrs, "user_id", p.User.ID)
			}
		}
		s.log.InfoContext(r.Context(), "http request", attrs...)
	})
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// recoverPanics turns a panic into a logged 500; http.ErrAbortHandler keeps its meaning.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic", "path", r.URL.Path, "request_id", requestID(r.Context()),
					"panic", v, "stack", string(debug.Stack()))
				s.renderError(w, r, errPanic)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

type panicError struct{}

func (panicError) Error() string { return "handler panicked" }

var errPanic error = panicError{}

// securityHeaders sets the headers every response carries: a strict CSP with no inline script,
// no sniffing, no framing, and a same-origin referrer.
func (s *Server) securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if s.secure() {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

// crossOrigin refuses state-changing browser requests from other origins with 403 (and audits
// the refusal). A state-changing request that carries the session cookie must also prove it is
// same-origin with Origin or Sec-Fetch-Site: every supported browser sends one, so a cookie-only
// request without either is refused too. Bearer-token requests (no cookie) without the headers
// are non-browser clients and pass; browsers never attach a token by themselves.
func (s *Server) crossOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.cop.Check(r); err != nil || s.cookieWithoutOrigin(r) {
			ctx, cancel := background(r.Context())
			defer cancel()
			s.audit(ctx, r, nil, "", "request.cross_origin_refused", "", "", map[string]any{
				"method": r.Method, "path": r.URL.Path, "origin": r.Header.Get("Origin")})
			s.renderError(w, r, errCrossOrigin)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cookieWithoutOrigin reports an unsafe request that would be authenticated by the session cookie
// yet names no origin at all (neither Origin nor Sec-Fetch-Site).
func (s *Server) cookieWithoutOrigin(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	if r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != "" || r.Header.Get("Authorization") != "" {
		return false
	}
	_, err := r.Cookie(s.sessions.Cookie.Name)
	return err == nil
}
