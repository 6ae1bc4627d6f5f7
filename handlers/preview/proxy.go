package preview

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"berth/db"
)

// target is what the shared reverse proxy needs of one request, carried in its context.
type target struct {
	svc    db.RuntimeService
	strip  bool
	proto  string
	prefix string // X-Forwarded-Prefix: "" at the origin's root, else /preview/{id}
}

type targetKey struct{}

// serveOrigin serves a request on service id's preview origin.
func (p *Proxy) serveOrigin(w http.ResponseWriter, r *http.Request, id string) {
	if r.URL.Path == TicketPath {
		p.exchange(w, r, id)
		return
	}
	ctx := r.Context()
	v, ok, err := p.viewer(r, id)
	if err != nil {
		if errors.Is(err, ErrUnauthorized) {
			writeError(w, http.StatusUnauthorized, "unauthorized", "The credential is not valid.")
			return
		}
		p.fail(w, r, id, err)
		return
	}
	if !ok {
		if browser(r) {
			// Berth's origin signs the browser in (or sends it to /login) and comes back with a ticket.
			http.Redirect(w, r, p.berthPath(id, r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		writeError(w, http.StatusUnauthorized, "unauthorized", "Sign in to Berth, or send a bearer token.")
		return
	}
	svc, err := p.cache.service(ctx, p.cfg.Pool, p.cfg.Local, id)
	if err != nil {
		p.fail(w, r, id, err)
		return
	}
	strip, err := p.grant(ctx, v, svc)
	if err != nil {
		p.fail(w, r, id, err)
		return
	}
	if v.RunID == "" && p.cfg.RemoteNode != nil && p.cfg.Forward != nil && svc.Status == db.ServiceRunning {
		if node := p.cfg.RemoteNode(r, svc.NodeID); node != "" { // it runs on another node
			p.touch(ctx, svc.ID)
			if err := p.cfg.Forward(w, r, node, "/internal/preview/"+svc.ID+r.URL.Path, v.UserID); err != nil {
				p.fail(w, r, id, err)
			}
			return
		}
	}
	p.proxy(w, r, svc, strip)
}

// ServeInternal serves a request another node forwarded for userID (already authenticated
// there) to service id, which runs on this node; path is the preview origin's path.
func (p *Proxy) ServeInternal(w http.ResponseWriter, r *http.Request, id, userID string) {
	ctx := r.Context()
	v, err := p.cfg.Auth.User(ctx, userID)
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "Not found.")
		return
	}
	svc, err := p.cache.service(ctx, p.cfg.Pool, p.cfg.Local, id)
	if err != nil {
		p.fail(w, r, id, err)
		return
	}
	strip, err := p.grant(ctx, v, svc)
	if err != nil {
		p.fail(w, r, id, err)
		return
	}
	p.proxy(w, r, svc, strip)
}

// grant is the cached access check of v for svc's generation, with the definition's strip_prefix.
func (p *Proxy) grant(ctx context.Context, v Viewer, svc db.RuntimeService) (bool, error) {
	key := grantKey{run: v.RunID, id: v.UserID, svc: svc.ID, gen: svc.Generation}
	now := time.Now()
	if strip, ok := get(p.cache, p.cache.grants, key, now); ok {
		return strip, nil
	}
	if err := p.cfg.Auth.Allowed(ctx, v, svc); err != nil {
		return false, err
	}
	strip := p.Strip(ctx, svc)
	put(p.cache, p.cache.grants, key, strip, now)
	return strip, nil
}

// proxy sends r to svc's process on this node.
func (p *Proxy) proxy(w http.ResponseWriter, r *http.Request, svc db.RuntimeService, strip bool) {
	if svc.Status != db.ServiceRunning || svc.Port == 0 {
		if browser(r) {
			http.Redirect(w, r, p.berthPath(svc.ID, "/"), http.StatusSeeOther) // Berth's page says why
			return
		}
		writeError(w, http.StatusServiceUnavailable, "service_"+svc.Status, "The preview's service is "+svc.Status+".")
		return
	}
	prefix := ""
	if !strip {
		prefix = "/preview/" + svc.ID
		if r.URL.Path == "/" {
			http.Redirect(w, r, prefix+"/", http.StatusSeeOther) // served under its older base
			return
		}
	}
	p.touch(r.Context(), svc.ID)
	proto := "http"
	if r.TLS != nil || p.cfg.Domain != "" && p.cfg.Berth.Scheme == "https" {
		proto = "https"
	}
	p.forward(w, r, &target{svc: svc, strip: strip, proto: proto, prefix: prefix})
}

// fail answers an error: not found or not allowed is the same 404; anything else a 502 page
// that links back to Berth (never a redirect, which could loop).
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, id string, err error) {
	if errors.Is(err, db.ErrNotFound) || errors.Is(err, ErrUnauthorized) {
		writeError(w, http.StatusNotFound, "not_found", "Not found.")
		return
	}
	if r.Context().Err() == nil {
		p.cfg.Log.WarnContext(r.Context(), "preview", "service_id", id, "err", err)
	}
	if browser(r) {
		writePage(w, http.StatusBadGateway, "The preview could not be reached.", p.berthPath(id, "/"), "See the service in Berth")
		return
	}
	writeError(w, http.StatusBadGateway, "preview_unreachable", "The preview could not be reached.")
}

// browser reports whether r wants a page.
func browser(r *http.Request) bool { return strings.Contains(r.Header.Get("Accept"), "text/html") }

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// writePage is a tiny page of the preview origin's own: no script, no Berth assets.
func writePage(w http.ResponseWriter, status int, msg, link, label string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	_, _ = w.Write([]byte("<!doctype html><title>Preview</title><p>" + html.EscapeString(msg) +
		` <a href="` + html.EscapeString(link) + `">` + html.EscapeString(label) + "</a></p>\n"))
}

// The transport's dial finds the request's target (its execution workspace) in its context: a
// service listens in its workspace's network namespace, reached through Config.Dial. The idle
// pool is keyed by the target address, and ports are unique per node, so each service's
// connections stay its own.

// bufferPool lends the reverse proxy its copy buffers (no allocation per response).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }

// transport is every preview request's way to its service.
func (p *Proxy) transport() *http.Transport {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var ws string
		if t, ok := ctx.Value(targetKey{}).(*target); ok {
			ws = t.svc.ExecutionWorkspaceID
		}
		_, portText, err := net.SplitHostPort(addr)
		port, perr := strconv.Atoi(portText)
		if p.cfg.Dial == nil || ws == "" || err != nil || perr != nil {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		return p.cfg.Dial(ctx, ws, port)
	}
	return &http.Transport{Proxy: nil, DialContext: dial, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256,
		IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: false, DisableCompression: true,
		WriteBufferSize: 32 << 10, ReadBufferSize: 32 << 10}
}

// reverseProxy serves the requests that switch protocols (a WebSocket); forward serves the
// rest. Its target comes from the request's context; the service sees the same header as
// forward sends, with the upgrade's Connection and Upgrade.
func (p *Proxy) reverseProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport:  p.tr,
		BufferPool: p.buffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(*target)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(t.svc.Port)
			pr.Out.Host = "" // the service's own 127.0.0.1:PORT (dev servers refuse foreign names)
			pr.Out.URL.Path, pr.Out.URL.RawPath = pr.In.URL.Path, pr.In.URL.RawPath
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			h := p.outHeader(pr.In, t)
			h["Connection"], h["Upgrade"] = pr.Out.Header["Connection"], pr.Out.Header["Upgrade"]
			pr.Out.Header = h
		},
		ModifyResponse: func(resp *http.Response) error {
			p.confineSetCookies(resp.Header)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if t, ok := r.Context().Value(targetKey{}).(*target); ok {
				p.upstreamFailed(w, r, t, err)
			}
		},
	}
}

// berthCookie reports whether a cookie name is Berth's (its session, or a preview cookie).
func (p *Proxy) berthCookie(name string) bool {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "__Host-"), "__Secure-")
	if strings.HasPrefix(name, CookiePrefix) || name == "berth_session" || name == "__Host-berth_session" {
		return true
	}
	for _, n := range p.cfg.BerthCookies {
		if name == n {
			return true
		}
	}
	return false
}

// appCookies is a request's Cookie header values less Berth's cookies, keeping the app's own.
// Values that cannot hold one of Berth's names are kept as they are (no parse, no allocation).
func (p *Proxy) appCookies(vals []string) []string {
	if len(vals) == 0 {
		return nil
	}
	if !p.mayHoldBerthCookie(vals) {
		return vals[:len(vals):len(vals)]
	}
	in := &http.Request{Header: http.Header{"Cookie": vals}}
	out := &http.Request{Header: http.Header{}}
	for _, c := range in.Cookies() {
		if !p.berthCookie(c.Name) {
			out.AddCookie(c)
		}
	}
	return out.Header["Cookie"]
}

// mayHoldBerthCookie reports whether a cookie named in vals could be one of Berth's: every name
// berthCookie accepts contains "berth_" or one of Config.BerthCookies.
func (p *Proxy) mayHoldBerthCookie(vals []string) bool {
	for _, v := range vals {
		if strings.Contains(v, "berth_") {
			return true
		}
		for _, n := range p.cfg.BerthCookies {
			if strings.Contains(v, n) {
				return true
			}
		}
	}
	return false
}

// confineSetCookies keeps a service's cookies on its own preview origin: a Set-Cookie for one
// of Berth's names is dropped, and a Domain attribute is removed (the cookie becomes host-only,
// never widened to a parent domain that Berth's host shares).
func (p *Proxy) confineSetCookies(h http.Header) {
	list := h.Values("Set-Cookie")
	if len(list) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, v := range list {
		c, err := http.ParseSetCookie(v)
		if err != nil || p.berthCookie(c.Name) {
			continue
		}
		if c.Domain != "" {
			c.Domain = ""
			v = c.String()
		}
		h.Add("Set-Cookie", v)
	}
}
