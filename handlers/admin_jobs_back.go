package handlers

import (
	"bytes"
	"html"
	"net/http"
	"strconv"
	"strings"
)

// River's UI is a single-page app Berth cannot change, so the way back to Berth is added around
// it: its HTML document (the only text/html it serves) gets a fixed "Berth" link to the dashboard
// and the small stylesheet that places it. Its API and assets pass through untouched.

// withBackLink wraps the River UI handler so its pages link back to Berth's dashboard.
func (s *Server) withBackLink(ui http.Handler) http.Handler {
	css := s.assets.URL("css/riverui.css")
	head := `<link rel="stylesheet" href="` + html.EscapeString(css) + `">`
	link := `<nav class="berth-back" aria-label="Berth"><a href="/">← Berth dashboard</a>` +
		`<a href="/admin/workspaces">Unmanaged directories</a></nav>`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api := strings.HasPrefix(r.URL.Path, adminJobsPrefix+"/api/")
		if api || r.Method != http.MethodGet {
			ui.ServeHTTP(w, r)
			return
		}
		// The document is rewritten, so partial and conditional answers of the original do not apply.
		for _, h := range []string{"Range", "If-Range", "If-Modified-Since", "If-None-Match"} {
			r.Header.Del(h)
		}
		bw := &htmlBuffer{ResponseWriter: w}
		ui.ServeHTTP(bw, r)
		if !bw.buffering {
			return
		}
		body := bw.buf.Bytes()
		body = insertBefore(body, "</head>", head)
		body = insertBefore(body, "</body>", link)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(bw.status)
		_, _ = w.Write(body)
	})
}

// insertBefore puts s before the last occurrence of tag in doc (case-insensitively); doc stays
// unchanged when it has no such tag.
func insertBefore(doc []byte, tag, s string) []byte {
	i := bytes.LastIndex(bytes.ToLower(doc), []byte(tag))
	if i < 0 {
		return doc
	}
	out := make([]byte, 0, len(doc)+len(s))
	out = append(out, doc[:i]...)
	out = append(out, s...)
	return append(out, doc[i:]...)
}

// htmlBuffer holds back a successful text/html response so it can be rewritten; anything else
// streams through unchanged.
type htmlBuffer struct {
	http.ResponseWriter
	buf       bytes.Buffer
	status    int
	decided   bool
	buffering bool
}

func (b *htmlBuffer) WriteHeader(status int) {
	if b.decided {
		return
	}
	b.decided = true
	b.status = status
	ct := b.Header().Get("Content-Type")
	b.buffering = status == http.StatusOK && strings.HasPrefix(ct, "text/html") && b.Header().Get("Content-Encoding") == ""
	if !b.buffering {
		b.ResponseWriter.WriteHeader(status)
	}
}

func (b *htmlBuffer) Write(p []byte) (int, error) {
	if !b.decided {
		b.WriteHeader(http.StatusOK)
	}
	if b.buffering {
		return b.buf.Write(p)
	}
	return b.ResponseWriter.Write(p)
}
