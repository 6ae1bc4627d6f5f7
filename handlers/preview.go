package handlers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"berth/db"
	"berth/views"
)

// The preview proxy (docs/previews.md): /preview/{id}/… reaches the runtime service id for a
// member of its company (any role, session or bearer token; a run token of its own workspace
// too). Without credentials a browser is sent to /login and anything else gets 401; anyone else
// gets the same 404 as for a missing service. Berth's session cookie and the Authorization header
// never reach the service, and a service cannot set Berth's session cookie. A service that does
// not run answers with a Berth page saying why (starting, failed with its log, stopped), never a
// bare 502.
//
// Headers: the proxied response carries the service's own headers, not Berth's CSP and framing
// rules (a dev server needs inline styles, eval'd modules and its own framing); the preview is
// same-origin with Berth, which is why only company members reach it and low trust gets no
// services at all.

// previewGrantTTL is how long the proxy reuses one principal's access check for one service
// generation (the membership, and the definition's strip_prefix); preview_cache.go keeps the
// credential and the service row as briefly, so a busy preview of a service running on this node
// costs no query per request. A member removed is seen within this time; a stopped or moved
// service at once.
const previewGrantTTL = time.Second

// previewGrant is a checked (principal, service generation) pair.
type previewGrant struct {
	a     access
	strip bool
	until time.Time
}

// previewTouchEvery bounds how often a proxied request updates the service's last_request_at.
const previewTouchEvery = 30 * time.Second

// berthPageHeaders are the headers Berth's middleware sets for its own pages, dropped from a
// proxied response.
var berthPageHeaders = []string{"Content-Security-Policy", "X-Frame-Options", "Cross-Origin-Opener-Policy", "Referrer-Policy"}

// previewProxy serves /preview/{id}/….
type previewProxy struct {
	s         *Server
	transport *http.Transport
	mu        sync.Mutex
	touched   map[string]time.Time
	grants    map[string]previewGrant // principal key + service id; see previewGrantTTL
}

func newPreviewProxy(s *Server) *previewProxy {
	return &previewProxy{s: s, touched: map[string]time.Time{}, grants: map[string]previewGrant{}, transport: &http.Transport{Proxy: nil,
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: false,
		DialContext: s.dialPreview}}
}

// previewWorkspace carries a proxied request's execution workspace to the transport's dial: a
// service listens in its workspace's network namespace, reached through Deps.DialService. The
// idle pool is keyed by the target, so each workspace's connections stay its own.
type previewWorkspace struct{}

// dialPreview dials a service's port in its workspace's network (Deps.DialService), or on the
// host when there is no such dialer.
func (s *Server) dialPreview(ctx context.Context, network, addr string) (net.Conn, error) {
	ws, _ := ctx.Value(previewWorkspace{}).(string)
	_, portText, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portText)
	if s.dialService == nil || ws == "" || err != nil || perr != nil {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return s.dialService(ctx, ws, port)
}

func (pv *previewProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pv.s.handle(pv.serve).ServeHTTP(w, r)
}

func (pv *previewProxy) serve(w http.ResponseWriter, r *http.Request) error {
	s := pv.s
	ctx := r.Context()
	id := r.PathValue("id")
	prefix := "/preview/" + id
	if r.URL.Path == prefix {
		http.Redirect(w, r, prefix+"/", http.StatusMovedPermanently)
		return nil
	}
	p := principalFrom(ctx)
	if p == nil {
		if strings.Contains(r.Header.Get("Accept"), "text/html") {
			redirectToLogin(w, r)
			return nil
		}
		// Not the error adapter: outside /api it would send a script to the login page too.
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]string{
			"code": errUnauthorized.Code, "message": errUnauthorized.Message}})
		return nil
	}
	svc, err := s.previews.service(ctx, s.pool, s.local, id)
	if err != nil {
		return err
	}
	key := grantKey(p) + "|" + svc.ID + "|" + strconv.FormatInt(svc.Generation, 10)
	g, ok := pv.grant(key)
	if !ok {
		if g, err = pv.check(r, p, svc); err != nil {
			return err
		}
		pv.keep(key, g)
	}
	a, strip := g.a, g.strip
	if done, err := pv.forwardPreview(w, r, p, svc); done { // it runs on another node (preview_forward.go)
		return err
	}
	if svc.Status != db.ServiceRunning || svc.Port == 0 {
		return pv.unavailable(w, r, a, svc)
	}
	pv.touch(r, svc.ID)

	target := &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(svc.Port)}
	r = r.WithContext(context.WithValue(r.Context(), previewWorkspace{}, svc.ExecutionWorkspaceID))
	proto := "http"
	if s.secure() {
		proto = "https"
	}
	rp := &httputil.ReverseProxy{
		Transport:     pv.transport,
		FlushInterval: -1, // stream: SSE and chunked responses reach the browser as they come
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target) // Host becomes 127.0.0.1:PORT
			if strip {
				pr.Out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, prefix), "/")
				pr.Out.URL.RawPath = ""
			} else {
				pr.Out.URL.Path, pr.Out.URL.RawPath = r.URL.Path, r.URL.RawPath
			}
			pr.Out.URL.RawQuery = r.URL.RawQuery
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Proxy-Authorization")
			stripBerthCookies(pr.Out, s.sessions.Cookie.Name)
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			pr.Out.Header.Set("X-Forwarded-Proto", proto)
			pr.Out.Header.Set("X-Forwarded-Host", r.Host)
		},
		ModifyResponse: func(resp *http.Response) error {
			for _, h := range berthPageHeaders {
				w.Header().Del(h)
			}
			dropSessionSetCookie(resp.Header, s.sessions.Cookie.Name)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(r.Context().Err(), err) || r.Context().Err() != nil {
				return // the browser went away
			}
			s.log.WarnContext(r.Context(), "preview upstream", "service_id", svc.ID, "err", err)
			s.previews.forget(svc.ID)
			if fresh, err := db.RuntimeServiceForProxy(r.Context(), s.pool, svc.ID); err == nil {
				svc = fresh // the page says what the service is now
			}
			_ = pv.unavailable(w, r, a, svc)
		},
	}
	rp.ServeHTTP(w, r)
	return nil
}

// check decides whether p may reach svc: the same 404 as for a missing service when not (instance
// admins who are not members see no previews).
func (pv *previewProxy) check(r *http.Request, p *principal, svc db.RuntimeService) (previewGrant, error) {
	ctx := r.Context()
	var a access
	var err error
	if p.Run != nil {
		if p.Run.Company.ID != svc.CompanyID || p.Run.WorkspaceID != svc.ExecutionWorkspaceID {
			return previewGrant{}, errNotFound
		}
		a = access{Company: p.Run.Company, Role: roleRun, P: p}
	} else if a, err = pv.s.companyAccess(ctx, p, svc.CompanyID); err != nil || a.Role == "" {
		return previewGrant{}, errNotFound
	}
	g := previewGrant{a: a, strip: true}
	if def, ok := pv.definition(r, svc); ok && def.StripPrefix != nil && !*def.StripPrefix {
		g.strip = false
	}
	return g, nil
}

// grantKey names who is asking, for the grant cache: a run, or a user (whatever credential).
func grantKey(p *principal) string {
	if p.Run != nil {
		return "run:" + p.Run.ID
	}
	return "user:" + p.User.ID
}

func (pv *previewProxy) grant(key string) (previewGrant, bool) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	g, ok := pv.grants[key]
	if !ok || time.Now().After(g.until) {
		delete(pv.grants, key)
		return previewGrant{}, false
	}
	return g, true
}

func (pv *previewProxy) keep(key string, g previewGrant) {
	now := time.Now()
	g.until = now.Add(previewGrantTTL)
	pv.mu.Lock()
	defer pv.mu.Unlock()
	prune(pv.grants, now, func(g previewGrant) time.Time { return g.until })
	pv.grants[key] = g
}

// definition is the service's definition in its project workspace, if it still has one.
func (pv *previewProxy) definition(r *http.Request, svc db.RuntimeService) (db.ServiceDefinition, bool) {
	if svc.ProjectWorkspaceID == "" {
		return db.ServiceDefinition{}, false
	}
	pw, err := db.ProjectWorkspaceByID(r.Context(), pv.s.pool, svc.CompanyID, svc.ProjectWorkspaceID)
	if err != nil {
		return db.ServiceDefinition{}, false
	}
	for _, d := range pw.Services {
		if d.Name == svc.Name {
			return d, true
		}
	}
	return db.ServiceDefinition{}, false
}

// touch records a proxied request for the idle_timeout policy, at most every previewTouchEvery.
func (pv *previewProxy) touch(r *http.Request, id string) {
	now := time.Now()
	pv.mu.Lock()
	last, ok := pv.touched[id]
	if ok && now.Sub(last) < previewTouchEvery {
		pv.mu.Unlock()
		return
	}
	pv.touched[id] = now
	pv.mu.Unlock()
	ctx, cancel := background(r.Context())
	defer cancel()
	if err := db.TouchRuntimeService(ctx, pv.s.pool, id); err != nil {
		pv.s.log.WarnContext(ctx, "preview touch", "service_id", id, "err", err)
	}
}

// unavailable answers a preview whose service does not run: a Berth page for browsers, a JSON
// error otherwise; 503 either way.
func (pv *previewProxy) unavailable(w http.ResponseWriter, r *http.Request, a access, svc db.RuntimeService) error {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		return &httpError{Status: http.StatusServiceUnavailable, Code: "service_" + svc.Status,
			Message: "The preview's service is " + svc.Status + "."}
	}
	row := runtimeServiceRow(svc, a.canManage())
	return pv.s.renderStatus(w, r, http.StatusServiceUnavailable,
		views.PreviewUnavailablePage(pv.s.frame(r, "Preview "+svc.Name, ""), views.PreviewUnavailable{Service: row}))
}

// runtimeServiceRow is a service as the pages show it.
func runtimeServiceRow(svc db.RuntimeService, canControl bool) views.ServiceRow {
	return views.ServiceRow{ID: svc.ID, Name: svc.Name, Status: svc.Reported(), Health: svc.Health, Port: svc.Port,
		URL: "/preview/" + svc.ID + "/", StopPolicy: svc.StopPolicy, StopReason: svc.StopReason, ExitCode: svc.ExitCode,
		LogExcerpt: svc.LogExcerpt, CanControl: canControl, WorkspaceID: svc.ExecutionWorkspaceID}
}

// stripBerthCookies removes Berth's session cookie from a request, keeping the service's own.
func stripBerthCookies(r *http.Request, name string) {
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name == name || c.Name == "berth_session" || c.Name == "__Host-berth_session" {
			continue
		}
		r.AddCookie(c)
	}
}

// dropSessionSetCookie removes any Set-Cookie of a response that would replace Berth's session.
func dropSessionSetCookie(h http.Header, name string) {
	list := h.Values("Set-Cookie")
	if len(list) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, v := range list {
		n, _, _ := strings.Cut(v, "=")
		n = strings.TrimSpace(n)
		if n == name || n == "berth_session" || n == "__Host-berth_session" {
			continue
		}
		h.Add("Set-Cookie", v)
	}
}
