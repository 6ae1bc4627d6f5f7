package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"berth/db"
	"berth/views"
)

// httpError is an error with a status, a stable code and a message safe to show to the caller.
type httpError struct {
	Status  int
	Code    string
	Message string
	Fields  map[string]string // per-field validation messages
	Extra   map[string]any    // additional members of the JSON error object (e.g. "current")
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Errors shared by many handlers.
var (
	errNotFound     = &httpError{Status: http.StatusNotFound, Code: "not_found", Message: "Not found."}
	errUnauthorized = &httpError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "Sign in or present an API token."}
	errForbidden    = &httpError{Status: http.StatusForbidden, Code: "forbidden", Message: "You may not do that."}
	errCrossOrigin  = &httpError{Status: http.StatusForbidden, Code: "cross_origin", Message: "Cross-origin request refused."}
)

// badRequest is a 400 with a message for the caller.
func badRequest(code, msg string) error {
	return &httpError{Status: http.StatusBadRequest, Code: code, Message: msg}
}

// handle adapts an error-returning handler: the one place that turns errors into responses.
func (s *Server) handle(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			s.renderError(w, r, err)
		}
	})
}

// classify maps any error to what the caller may see. Not-found and not-yours are the same 404;
// anything unexpected is a 500 with no detail (and is logged). renderError first lets
// databaseError (dbavail.go) turn an outage or an exhausted pool into its 503.
func classify(err error) (*httpError, bool) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he, false
	case errors.Is(err, db.ErrNotFound):
		return errNotFound, false
	case errors.Is(err, db.ErrConflict):
		return &httpError{Status: http.StatusConflict, Code: "conflict", Message: "That conflicts with an existing record."}, false
	default:
		return &httpError{Status: http.StatusInternalServerError, Code: "internal", Message: "Something went wrong on our side. It has been logged."}, true
	}
}

// wantsJSON reports whether the error should be JSON: every /api route, /mcp, and clients that ask.
func wantsJSON(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/mcp" || strings.Contains(r.Header.Get("Accept"), "application/json") &&
		!strings.Contains(r.Header.Get("Accept"), "text/html")
}

// renderError writes err as a JSON error object, an htmx fragment or a full HTML page.
func (s *Server) renderError(w http.ResponseWriter, r *http.Request, err error) {
	he, unexpected := classify(s.databaseError(r, err))
	if unexpected {
		s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path,
			"request_id", requestID(r.Context()), "err", err)
	}
	if he.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(he.RetryAfter))
	}
	if he.Status == http.StatusUnauthorized && !wantsJSON(r) {
		redirectToLogin(w, r)
		return
	}
	if wantsJSON(r) {
		body := map[string]any{"code": he.Code, "message": he.Message}
		if len(he.Fields) > 0 {
			body["fields"] = he.Fields
		}
		for k, v := range he.Extra {
			body[k] = v
		}
		writeJSON(w, he.Status, map[string]any{"error": body})
		return
	}
	info := views.ErrorInfo{Status: he.Status, Message: he.Message}
	if r.Header.Get("HX-Request") == "true" {
		s.renderStatus(w, r, he.Status, views.ErrorBody(info))
		return
	}
	s.renderStatus(w, r, he.Status, views.ErrorPage(s.frame(r, http.StatusText(he.Status), ""), info))
}

// redirectToLogin sends a browser to the sign-in page (htmx gets HX-Redirect so the whole page moves).
func redirectToLogin(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("HX-Request") == "true" {
		w.Header().Set("HX-Redirect", "/login")
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// invalid is a 422 with one message per offending field.
func invalid(fields map[string]string) error {
	return &httpError{Status: http.StatusUnprocessableEntity, Code: "validation_failed",
		Message: "Some fields are not valid.", Fields: fields}
}
