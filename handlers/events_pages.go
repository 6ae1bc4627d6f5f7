package handlers

import (
	"context"
	"net/http"
	"net/url"
)

// sseAsset is the URL of htmx's SSE extension, loaded only when pages are live (an Events hub).
func (s *Server) sseAsset() string {
	if s.events == nil {
		return ""
	}
	return s.assets.URL("vendor/htmx-ext-sse.min.js")
}

// liveURL is a page's GET /events URL: its filter (name, value pairs) and the hub's cursor now,
// so a change committed after the page read its data reaches it even if it lands before the
// stream connects (docs/live.md). Call it before reading what the page shows; "" when pages
// are not live on this node.
func (s *Server) liveURL(filter ...string) string {
	if s.events == nil {
		return ""
	}
	q := url.Values{}
	for i := 0; i+1 < len(filter); i += 2 {
		q.Set(filter[i], filter[i+1])
	}
	q.Set("after", s.events.Cursor())
	return "/events?" + q.Encode()
}

// liveKey is the request context key of the page's /events URL (frame puts it in the Frame).
type liveKey struct{}

// live marks the request's page as live with the given filter: its frame subscribes to
// liveURL(filter...), taken now, before the handler reads what the page shows.
func (s *Server) live(r *http.Request, filter ...string) *http.Request {
	u := s.liveURL(filter...)
	if u == "" || isHTMX(r) {
		return r // fragments and non-live nodes need no stream
	}
	return r.WithContext(context.WithValue(r.Context(), liveKey{}, u))
}

// liveFrom is the page's /events URL, "" for a page that is not live.
func liveFrom(r *http.Request) string {
	u, _ := r.Context().Value(liveKey{}).(string)
	return u
}
