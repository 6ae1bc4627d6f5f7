package handlers

// Forwarding to the owning node (DESIGN §11, docs/scaling.md): a preview whose service runs on
// another node (package preview decides, and calls forwardTo), or a terminal whose shell does, is proxied to that node's internal listener,
// signed with the node-to-node key (internal.go). The web node has already decided who the
// caller is; Berth's cookies and the Authorization header never leave it. WebSocket upgrades pass
// through (httputil.ReverseProxy switches protocols on both hops).

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"berth/db"
)

// nodeURLTTL is how long a web node reuses another node's internal URL and liveness.
const nodeURLTTL = 2 * time.Second

// nodeDirectory caches other nodes' internal URLs briefly (a busy preview costs no query per
// request).
type nodeDirectory struct {
	transport *http.Transport // to the other nodes' internal listeners
	mu        sync.Mutex
	entries   map[string]nodeEntry
}

type nodeEntry struct {
	url   *url.URL // nil: down or no internal listener
	until time.Time
}

// nodeURL is node id's internal listener, or nil when it is down or has none.
func (s *Server) nodeURL(r *http.Request, id string) *url.URL { return s.nodeURLCtx(r.Context(), id) }

// nodeURLCtx is nodeURL outside a request.
func (s *Server) nodeURLCtx(ctx context.Context, id string) *url.URL {
	d := s.nodeDir()
	now := time.Now()
	d.mu.Lock()
	e, ok := d.entries[id]
	d.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.url
	}
	e = nodeEntry{until: now.Add(nodeURLTTL)}
	if n, err := db.NodeByID(ctx, s.pool, id, s.nodes.deadAfter()); err == nil && n.Alive && n.InternalURL != "" {
		if u, err := url.Parse(n.InternalURL); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
			e.url = u
		}
	}
	d.mu.Lock()
	prune(d.entries, now, func(e nodeEntry) time.Time { return e.until })
	d.entries[id] = e
	d.mu.Unlock()
	return e.url
}

// nodeDir is the server's directory, made on first use.
func (s *Server) nodeDir() *nodeDirectory {
	s.nodes.dirOnce.Do(func() {
		s.nodes.dir = &nodeDirectory{entries: map[string]nodeEntry{},
			transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	})
	return s.nodes.dir
}

// remoteNode reports the node other than this one that owns a process, or "" to serve here.
func (s *Server) remoteNode(r *http.Request, owner string) string {
	if s.nodes == nil || len(s.nodes.Key) == 0 || owner == "" || owner == s.nodes.Self ||
		strings.HasPrefix(r.URL.Path, "/internal/") {
		return ""
	}
	return owner
}

var errNodeDown = &httpError{Status: http.StatusServiceUnavailable, Code: "node_unavailable",
	Message: "The node that runs this is down or unreachable; try again when it is back."}

// forwardTo proxies r to node's internal listener under path, signed, as user (may be "").
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, node, path, user string) error {
	return s.forward(w, r, node, path, user, s.renderError)
}

// forwardPreview is forwardTo for a preview origin's request: its refusals are plain JSON (a
// preview origin has no Berth session or pages).
func (s *Server) forwardPreview(w http.ResponseWriter, r *http.Request, node, path, user string) error {
	fail := func(w http.ResponseWriter, r *http.Request, err error) {
		he, _ := classify(err)
		writeJSON(w, he.Status, map[string]any{"error": map[string]string{"code": he.Code, "message": he.Message}})
	}
	if err := s.forward(w, r, node, path, user, fail); err != nil {
		fail(w, r, err)
	}
	return nil
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, node, path, user string, fail func(http.ResponseWriter, *http.Request, error)) error {
	target := s.nodeURL(r, node)
	if target == nil {
		return errNodeDown
	}
	// The signature covers the body: read it here (capped), so Rewrite signs what it sends.
	if _, err := bufferNodeBody(r); err != nil {
		if errors.Is(err, errNodeBodyTooLarge) {
			return errNodeBodyTooLarge
		}
		return badRequest("bad_body", "The request body could not be read.")
	}
	rp := &httputil.ReverseProxy{
		Transport:     s.nodeDir().transport,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + path
			pr.Out.URL.RawPath = ""
			pr.Out.URL.RawQuery = r.URL.RawQuery
			pr.Out.Host = r.Host // the owning node sets X-Forwarded-Host from it
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Del(nodeAuthHeader)
			pr.Out.Header.Del(nodeBodyHeader)
			stripBerthCookies(pr.Out, s.sessions.Cookie.Name)
			pr.Out.Header.Del(nodeUserHeader)
			if user != "" {
				pr.Out.Header.Set(nodeUserHeader, user)
			}
			_ = signNodeRequest(pr.Out, s.nodes.Key, time.Now()) // the body is in memory already: no error
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away
			}
			s.log.WarnContext(r.Context(), "forward to node", "node", node, "err", err)
			s.nodeDir().forget(node)
			fail(w, r, errNodeDown)
		},
	}
	rp.ServeHTTP(w, r)
	return nil
}

func (d *nodeDirectory) forget(id string) {
	d.mu.Lock()
	delete(d.entries, id)
	d.mu.Unlock()
}

// forwardTerminal sends a setup session's terminal WebSocket to the node holding its shell; it
// reports whether it answered. The first frame's token still authenticates the user there.
func (s *Server) forwardTerminal(w http.ResponseWriter, r *http.Request, id string) (bool, error) {
	if s.nodes == nil || strings.HasPrefix(r.URL.Path, "/internal/") {
		return false, nil
	}
	owner, err := db.SetupSessionNode(r.Context(), s.pool, id)
	if err != nil {
		return false, err
	}
	node := s.remoteNode(r, owner)
	if node == "" {
		return false, nil
	}
	return true, s.forwardTo(hijacker{w}, r, node, "/internal/image-setup-sessions/"+id+"/terminal", "")
}

// prune keeps m under 4096 entries: expired entries go first, then all. Callers hold the lock.
func prune[V any](m map[string]V, now time.Time, until func(V) time.Time) {
	if len(m) < 4096 {
		return
	}
	for k, v := range m {
		if now.After(until(v)) {
			delete(m, k)
		}
	}
	if len(m) >= 4096 {
		clear(m)
	}
}
