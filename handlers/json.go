package handlers

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
)

// maxJSONBody is the largest JSON request body Berth reads.
const maxJSONBody = 1 << 20

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}

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
