package handlers

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"time"
)

// maxJSONBody is the largest JSON request body Berth reads.
const maxJSONBody = 1 << 20

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	if k, ok := w.(valueKeeper); ok {
		k.keepValue(v)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}

// valueKeeper is a response writer that also keeps the value writeJSON encodes (the MCP server's
// in-process calls, mcp_endpoint.go), so that its consumer need not decode what was just encoded.
type valueKeeper interface{ keepValue(v any) }

// decodeJSON reads a request body into dst: any non-empty body must be application/json (415),
// at most 1 MiB (413), one object with only known fields (400).
func decodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	if r.ContentLength == 0 && r.Header.Get("Content-Type") == "" {
		return badRequest("empty_body", "A JSON body is required.")
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return &httpError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Message: "Send the body as application/json."}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Message: "The body is larger than 1 MiB."}
		}
		if errors.Is(err, io.EOF) {
			return badRequest("empty_body", "A JSON body is required.")
		}
		return badRequest("bad_json", "The body is not valid JSON for this request: "+err.Error())
	}
	if dec.More() {
		return badRequest("bad_json", "The body must hold exactly one JSON object.")
	}
	return nil
}

// errServerOwned refuses a body that sets a field only the server writes: a 400 naming the
// field (why, if not empty, says more about it).
func errServerOwned(field, why string) error {
	msg := field + " is written by the server only"
	if why != "" {
		msg += " (" + why + ")"
	}
	return &httpError{Status: http.StatusBadRequest, Code: "server_owned_field",
		Message: msg + "; remove it from the request.", Extra: map[string]any{"field": field}}
}

// deref is the string p points to, or "" for nil (an optional JSON member that was absent).
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// optional is s for JSON, or null when s is empty.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// utcPtr is *t in UTC for JSON, or null.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// emptyJSONBody accepts an action's optional body: nothing, or a JSON object with no fields.
func emptyJSONBody(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength == 0 {
		return nil
	}
	var none struct{}
	return decodeJSON(w, r, &none)
}
