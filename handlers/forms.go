package handlers

// The form helpers every page form shares: reading the body, telling a refusal the form shows
// in place from an error for the adapter, and sending the browser on after a success. A form
// answers a refusal with the refusal's own status (422 for validation, 409 for a conflict),
// for htmx and plain browsers alike: static/js/app.js tells htmx to swap 422 and 409 answers.

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
)

// Form body limits: the company sections' short forms, and forms that carry free text
// (descriptions, commands, environment settings) up to the JSON API's own limit.
const (
	maxFormBody     = 64 << 10
	maxTextFormBody = maxJSONBody
)

// readForm reads a urlencoded form body of at most limit bytes: 413 over it, 400 when it cannot
// be parsed.
func readForm(w http.ResponseWriter, r *http.Request, limit int64) (url.Values, error) {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: "The form is larger than " + byteSize(limit) + "."}
		}
		return nil, badRequest("bad_form", "The form could not be read.")
	}
	return r.PostForm, nil
}

// byteSize says a body limit in KiB or MiB.
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// formRefusal reports whether err is a refusal a form shows in place, with the form and its
// messages, rather than as an error page: a validation 422 or a conflict 409 (a taken name, a
// state that moved on). Its Fields go next to the fields; a refusal without fields is said in
// the form's or the page's alert (see formErrors).
func formRefusal(err error) (*httpError, bool) {
	var he *httpError
	if errors.As(err, &he) && (he.Status == http.StatusUnprocessableEntity || he.Status == http.StatusConflict) {
		return he, true
	}
	return nil, false
}

// formErrors is what a form shows for a refusal: its field messages, or, when it names no
// field, its message under the key "" (the form's summary alert).
func formErrors(he *httpError) map[string]string {
	if len(he.Fields) > 0 {
		return he.Fields
	}
	return map[string]string{"": he.Message}
}

// redirectAfterForm sends the browser to url after a successful form: a 303 for a plain form;
// for htmx a 200 with HX-Redirect, so the whole page moves (htmx follows the header before it
// would swap anything).
func redirectAfterForm(w http.ResponseWriter, r *http.Request, url string) {
	if isHTMX(r) {
		w.Header().Set("HX-Redirect", url)
		w.WriteHeader(http.StatusOK)
		return
	}
	http.Redirect(w, r, url, http.StatusSeeOther)
}

// refusalMessage is a refused change said in one line: the message and any field messages.
func refusalMessage(he *httpError) string {
	msg := he.Message
	for _, field := range slices.Sorted(maps.Keys(he.Fields)) {
		msg += " " + he.Fields[field]
	}
	return msg
}

// asValidation extracts field errors from err, for forms that re-render with messages.
func asValidation(err error) (map[string]string, bool) {
	var he *httpError
	if errors.As(err, &he) && he.Code == "validation_failed" {
		return he.Fields, true
	}
	return nil, false
}
