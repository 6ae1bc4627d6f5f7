// Package preview serves runtime services' previews on origins of their own, never on Berth's
// (DESIGN §14, docs/previews.md).
//
// It owns: the preview origins (a service's host under BERTH_PREVIEW_DOMAIN, or a port of
// BERTH_PREVIEW_PORTS with its listener), the ticket exchange and the preview-only cookie, the
// reverse proxy to a service (dialed in its workspace's network through Config.Dial), the short
// caches of credentials, access checks and service rows, and the decision to send a request to
// the node that runs the service. It may touch: runtime_services rows and project workspace
// definitions (read), preview_tickets (consumed), its own listeners, and dials to services.
// Nothing else: who a bearer token or a user id names and whether they may see a service are
// asked of Config.Auth (package handlers), and a node-to-node request goes through
// Config.Forward. It never serves Berth's pages or API, never sees or sets Berth's session
// cookie, and never lets a service's Set-Cookie reach beyond the service's own origin. Package
// handlers imports it, never the reverse.
package preview

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// Viewer is who a request on a preview origin acts for: a user (by any credential) or a run (by
// its run token).
type Viewer struct {
	UserID         string
	RunID          string // set for a run token
	RunCompanyID   string
	RunWorkspaceID string
}

// ErrUnauthorized is what Auth answers for a credential that names nobody (unknown, revoked,
// expired, a disabled user, an ended run).
var ErrUnauthorized = errors.New("preview: credential not valid")

// Auth is what the preview origin asks of Berth (package handlers implements it).
type Auth interface {
	// Bearer resolves a bearer token (a user's API token or a run token).
	Bearer(ctx context.Context, r *http.Request, token string) (Viewer, error)
	// User resolves the user a ticket or a preview cookie names.
	User(ctx context.Context, userID string) (Viewer, error)
	// Allowed reports whether v may see svc's preview (a member of its company, any role, or a
	// run of its own workspace); db.ErrNotFound when not.
	Allowed(ctx context.Context, v Viewer, svc db.RuntimeService) error
}

// LocalServices is the runtime services this node's supervisor runs (jobs/services.Supervisor);
// nil on a node without workers.
type LocalServices interface {
	// Serving is the port service id's live process listens on, false when this node runs none.
	Serving(id string) (port int, ok bool)
}

// Config is what a Proxy needs.
type Config struct {
	Pool *pgxpool.Pool
	Log  *slog.Logger
	Auth Auth
	// Berth is Berth's own base URL: tickets are minted there, and a preview origin sends a
	// browser without credentials, or a service that does not run, back to it.
	Berth *url.URL
	// Domain is BERTH_PREVIEW_DOMAIN without "*." ("preview.example.com": a service is
	// {id}.preview.example.com on Berth's listener); empty selects per-service ports.
	Domain string
	// Ports is BERTH_PREVIEW_PORTS; the zero value takes free ports the kernel picks (tests).
	Ports PortRange
	// BindHost is the interface the per-service listeners bind (BERTH_ADDR's host).
	BindHost string
	// URLHost is the host name per-service preview URLs carry (PortURLHost).
	URLHost string
	// Key signs preview cookies (a key derived from Berth's secret key for this purpose only).
	Key []byte
	// Local lets the proxy trust a cached service row while this node runs the service.
	Local LocalServices
	// Dial reaches port in an execution workspace's network (Deps.DialService); nil dials the host.
	Dial func(ctx context.Context, workspaceID string, port int) (net.Conn, error)
	// RemoteNode names the node other than this one that must serve a service owned by owner, or "".
	RemoteNode func(r *http.Request, owner string) string
	// Forward sends r to node's internal listener under path, signed, as user.
	Forward func(w http.ResponseWriter, r *http.Request, node, path, userID string) error
	// BerthCookies are Berth's session cookie names: never passed to a service, never set by one.
	BerthCookies []string
}

// Proxy serves preview origins.
type Proxy struct {
	cfg     Config
	cache   *cache
	tr      *http.Transport // to the services
	buffers *bufferPool     // copy buffers of forward and rp
	rp      http.Handler    // a protocol upgrade's proxy
	// flushDelay is how long a body of unknown length waits unflushed (streamFlushDelay).
	flushDelay time.Duration
	ports      *ports
	mu         sync.Mutex
	touched    map[string]time.Time
	closeOne   sync.Once
}

// New builds the proxy; with per-service ports it opens listeners as services get URLs.
func New(cfg Config) (*Proxy, error) {
	if cfg.Pool == nil || cfg.Log == nil || cfg.Auth == nil || cfg.Berth == nil || len(cfg.Key) == 0 {
		return nil, errors.New("preview: pool, log, auth, Berth's URL and a key are required")
	}
	cfg.Domain = strings.TrimPrefix(strings.ToLower(strings.TrimSuffix(cfg.Domain, ".")), "*.")
	if cfg.URLHost == "" {
		cfg.URLHost = PortURLHost(cfg.Berth.Hostname())
	}
	p := &Proxy{cfg: cfg, cache: newCache(), touched: map[string]time.Time{}}
	p.tr, p.flushDelay = p.transport(), streamFlushDelay
	p.buffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
	p.rp = p.reverseProxy()
	if cfg.Domain == "" {
		p.ports = newPorts(p, cfg.Ports, cfg.BindHost)
	}
	return p, nil
}

// Close closes the per-service listeners (and the connections they serve).
func (p *Proxy) Close() {
	p.closeOne.Do(func() {
		if p.ports != nil {
			p.ports.close()
		}
	})
}

// PortURLHost is the host name a per-service preview URL uses when Berth is reached at
// berthHost: the other loopback spelling for a loopback Berth (so that the browser keeps the
// previews' cookies apart from Berth's: cookies are shared across the ports of one host name),
// else Berth's host itself.
func PortURLHost(berthHost string) string {
	switch strings.ToLower(strings.Trim(berthHost, "[]")) {
	case "127.0.0.1", "":
		return "localhost"
	case "localhost", "::1":
		return "127.0.0.1"
	}
	return berthHost
}

// live reports whether a service row stands for a process that is meant to answer.
func live(svc db.RuntimeService) bool {
	return svc.Status == db.ServiceRunning || svc.Status == db.ServiceStarting
}

// URL is svc's absolute preview URL: its own host under the preview domain, or its port on the
// preview listener while it is starting or running (a port is given then, and kept while it
// lasts). A stopped service without a port gets Berth's /preview/{id}/, which explains.
func (p *Proxy) URL(svc db.RuntimeService) string {
	if o, ok := p.origin(svc); ok {
		return o + "/"
	}
	return strings.TrimSuffix(p.cfg.Berth.String(), "/") + "/preview/" + svc.ID + "/"
}

// origin is svc's preview origin ("http://host:port"), false when it has none now.
func (p *Proxy) origin(svc db.RuntimeService) (string, bool) {
	if p.cfg.Domain != "" {
		return p.cfg.Berth.Scheme + "://" + svc.ID + "." + p.cfg.Domain, true
	}
	port, ok := p.ports.lookup(svc.ID)
	if !ok && live(svc) {
		port, ok = p.ports.assign(svc.ID)
	}
	if !ok {
		return "", false
	}
	return "http://" + net.JoinHostPort(p.cfg.URLHost, strconv.Itoa(port)), true
}

// ServiceForHost is the service whose preview origin host names under BERTH_PREVIEW_DOMAIN.
func (p *Proxy) ServiceForHost(host string) (string, bool) {
	if p.cfg.Domain == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+p.cfg.Domain)
	if !ok || !db.ValidID(label) {
		return "", false
	}
	return label, true
}

// ServeHost serves a request on the preview origin of service id (BERTH_PREVIEW_DOMAIN).
func (p *Proxy) ServeHost(w http.ResponseWriter, r *http.Request, id string) { p.serveOrigin(w, r, id) }

// touchEvery bounds how often a proxied request updates the service's last_request_at.
const touchEvery = 30 * time.Second

// touch records a proxied request for the idle_timeout policy, at most every touchEvery.
func (p *Proxy) touch(ctx context.Context, id string) {
	now := time.Now()
	p.mu.Lock()
	last, ok := p.touched[id]
	if ok && now.Sub(last) < touchEvery {
		p.mu.Unlock()
		return
	}
	if len(p.touched) > cacheMax {
		clear(p.touched)
	}
	p.touched[id] = now
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := db.TouchRuntimeService(ctx, p.cfg.Pool, id); err != nil {
		p.cfg.Log.WarnContext(ctx, "preview touch", "service_id", id, "err", err)
	}
}

// Strip reports whether svc is served at its origin's root (its definition's strip_prefix,
// true unless it says false); false keeps the older /preview/{id}/ base.
func (p *Proxy) Strip(ctx context.Context, svc db.RuntimeService) bool {
	if svc.ProjectWorkspaceID == "" {
		return true
	}
	pw, err := db.ProjectWorkspaceByID(ctx, p.cfg.Pool, svc.CompanyID, svc.ProjectWorkspaceID)
	if err != nil {
		return true
	}
	for _, d := range pw.Services {
		if d.Name == svc.Name {
			return d.StripPrefix == nil || *d.StripPrefix
		}
	}
	return true
}
