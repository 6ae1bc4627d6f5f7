// Package handlers is Berth's HTTP surface: the server-rendered pages (templ + htmx) and the JSON
// API under /api. routes.go is the whole route table; handlers return errors and one adapter
// turns them into responses, so every refusal looks the same. Handlers read and write through
// db and enqueue jobs (jobs.Enqueue) in the same transaction. What outlives a request is started
// by cmd/berth under its context and handed in through Deps (the River UI, the event hub's
// listener, the runtime-service supervisor, the terminal registry); the server itself runs only
// the preview origins' listeners (handlers/preview), which Close stops.
// They reach the filesystem and processes only through package workspace, never directly:
// checking a project workspace's source (workspace.ValidateSource may run git), reading a task's
// files (workspace.Files, confined to its roots), and reading an execution workspace's git
// state for close-readiness (workspace.Manager runs git in the worktree).
package handlers

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/alexedwards/scs/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment/seal"
	"berth/handlers/live"
	bmcp "berth/handlers/mcp"
	"berth/handlers/metrics"
	"berth/handlers/preview"
	"berth/workspace"
)

// Assets is the front-end file set the pages link to.
type Assets interface {
	URL(name string) string
	Handler() http.Handler
}

// Deps are the server's dependencies, built by cmd/berth.
type Deps struct {
	Pool *pgxpool.Pool
	Jobs *river.Client[pgx.Tx] // insert-only or working; used to enqueue inside transactions
	// JobsUI is the River UI (NewJobsUI), mounted at /admin/jobs for instance admins; nil leaves
	// /admin/jobs a 404.
	JobsUI  http.Handler
	Assets  Assets
	Log     *slog.Logger
	BaseURL *url.URL     // the URL people use to reach Berth; https turns on Secure cookies
	Secrets *seal.Sealer // seals environment secrets at rest
	// ReceiptKey signs and verifies run receipts (a discarded attempt's is re-signed; POST
	// /api/runs/{id}/receipt/verify); cmd/berth derives it from the secret key.
	ReceiptKey []byte
	// Workspaces maps execution workspace refs to this node's directories, for the file browser;
	// nil means execution workspaces are not readable here.
	Workspaces *workspace.Manager
	// FileRateBurst is how many file-resource requests one user (or run) may make per minute on
	// this node; 0 is the default, 120.
	FileRateBurst int
	// Artifacts is this node's artifact store, for checking a receipt's capsule digest (POST
	// /api/runs/{id}/receipt/verify); nil skips that check.
	Artifacts *workspace.Artifacts
	// SourceRoots are the host directories under which board members may point local project
	// workspace sources; instance admins may use any path.
	SourceRoots []string
	Version     string
	// LoginLimit slows repeated failed sign-ins per account and per address; zero values take
	// the defaults.
	LoginLimit LoginLimit
	// TrustedProxies are the peers whose X-Forwarded-For names the client address; empty trusts
	// no forwarding header.
	TrustedProxies []netip.Prefix
	// ImageSetup runs image setup sessions' shells on this node; nil refuses setup sessions.
	ImageSetup *ImageSetup
	// Metrics is the registry GET /metrics exposes (metrics.New); nil makes one.
	Metrics *metrics.Registry
	// MetricsToken, when set, is a bearer token that may read GET /metrics (BERTH_METRICS_TOKEN).
	MetricsToken string
	// Events fans this node's LISTEN berth_events out to GET /events streams (handlers/live); nil
	// turns live pages off (GET /events is 404 and pages do not subscribe).
	Events *live.Hub
	// LocalServices is this node's runtime service supervisor (jobs/services.Supervisor), which
	// lets the preview proxy skip the service row while it runs here; nil reads the row per request.
	LocalServices LocalServices
	// PreviewDomain is BERTH_PREVIEW_DOMAIN ("*.preview.example.com"): each service's preview
	// origin is {id}.preview.example.com, served by this handler by Host. Empty: PreviewPorts.
	PreviewDomain string
	// PreviewPorts is BERTH_PREVIEW_PORTS, one port per running service on a listener of its
	// own; the zero value takes free ports the kernel picks.
	PreviewPorts preview.PortRange
	// PreviewBind is the interface those listeners bind (BERTH_ADDR's host; "" = the base
	// URL's host).
	PreviewBind string
	// PreviewKey signs preview cookies (PreviewKey(secret)); nil makes a key for this process.
	PreviewKey []byte
	// Nodes is this node's place among the others (nodes.go): previews and terminals owned by
	// another node are forwarded to its internal listener; nil means a single node.
	Nodes *Nodes
	// DialService reaches port in an execution workspace's network on this node (its services
	// listen in the workspace's namespace, not on the host: jobs/services.Supervisor.DialService);
	// nil dials 127.0.0.1:port on the host.
	DialService func(ctx context.Context, workspaceID string, port int) (net.Conn, error)
	// OnEnvironmentChange hears of every change of an environment made through this node (its
	// egress policy applies to the next connection: jobs.Egress.Invalidate); nil ignores them.
	OnEnvironmentChange func(environmentID string)
	// HostChecks reports what this machine offers (the first-run checklist, onboarding.go); nil
	// shows no findings.
	HostChecks func(context.Context) []HostCheck
}

// Server holds the dependencies every handler uses.
type Server struct {
	pool        *pgxpool.Pool
	jobs        *river.Client[pgx.Tx]
	assets      Assets
	log         *slog.Logger
	baseURL     *url.URL
	secrets     *seal.Sealer
	receiptKey  []byte
	sourceRoots []string
	workspaces  *workspace.Manager
	artifacts   *workspace.Artifacts
	fileBurst   int
	version     string
	limit       LoginLimit
	proxies     []netip.Prefix
	sessions    *scs.SessionManager
	cop         *http.CrossOriginProtection
	handler     http.Handler
	imageSetup  *ImageSetup
	envChanged  func(environmentID string)
	prober      *db.Prober     // /api/health's own connection (dbavail.go)
	nodes       *Nodes         // nodes.go, internal.go
	preview     *preview.Proxy // the preview origins (handlers/preview; preview_origin.go)
	mcp         *bmcp.Server   // the /mcp endpoint's server (mcp_endpoint.go)
	hostChecks  func(context.Context) []HostCheck

	// GET /events (handlers/live, events_stream.go); eventsHeartbeat 0 is the default interval.
	events          *live.Hub
	eventsHeartbeat time.Duration

	// GET /metrics (metrics.go).
	metrics      *metrics.Registry
	metricsToken []byte // sha256 of BERTH_METRICS_TOKEN; nil when unset
}

// New builds the server and its route table.
func New(d Deps) (*Server, error) {
	if d.Pool == nil || d.Assets == nil || d.Log == nil || d.BaseURL == nil || d.Secrets == nil || len(d.ReceiptKey) == 0 {
		return nil, fmt.Errorf("handlers: pool, assets, log, base URL, secrets and receipt key are required")
	}
	s := &Server{
		pool:        d.Pool,
		jobs:        d.Jobs,
		assets:      d.Assets,
		log:         d.Log,
		baseURL:     d.BaseURL,
		secrets:     d.Secrets,
		receiptKey:  d.ReceiptKey,
		sourceRoots: d.SourceRoots,
		workspaces:  d.Workspaces,
		artifacts:   d.Artifacts,
		fileBurst:   d.FileRateBurst,
		version:     d.Version,
		limit:       d.LoginLimit,
		proxies:     d.TrustedProxies,
		imageSetup:  d.ImageSetup,
		events:      d.Events,
		envChanged:  d.OnEnvironmentChange,
		nodes:       d.Nodes,
		hostChecks:  d.HostChecks,
	}
	s.limit = s.limit.withDefaults()

	if err := s.initMetrics(d); err != nil {
		return nil, err
	}

	s.sessions = scs.New()
	// No cleanup goroutine (its start races with StopCleanup): the housekeeping job deletes
	// expired sessions, and Find ignores them until then.
	s.sessions.Store = db.NewSessionStore(d.Pool) // sha256(token) at rest: reading the table yields no live session
	s.sessions.Lifetime = 24 * time.Hour
	s.sessions.IdleTimeout = 8 * time.Hour
	s.sessions.Cookie.Name = "berth_session"
	s.sessions.Cookie.HttpOnly = true
	s.sessions.Cookie.SameSite = http.SameSiteLaxMode
	s.sessions.Cookie.Path = "/"
	s.sessions.Cookie.Persist = true
	if d.BaseURL.Scheme == "https" {
		// The __Host- prefix pins the cookie to this exact host, over https, for the whole site.
		s.sessions.Cookie.Name = "__Host-berth_session"
		s.sessions.Cookie.Secure = true
	}
	s.sessions.ErrorFunc = func(w http.ResponseWriter, r *http.Request, err error) {
		s.renderError(w, r, fmt.Errorf("session: %w", err))
	}

	s.cop = http.NewCrossOriginProtection()
	if err := s.cop.AddTrustedOrigin(strings.TrimSuffix(d.BaseURL.Scheme+"://"+d.BaseURL.Host, "/")); err != nil {
		return nil, fmt.Errorf("handlers: trusted origin: %w", err)
	}

	if err := s.initPreview(d); err != nil {
		return nil, err
	}
	s.handler = s.middleware(s.routes(d.JobsUI))
	return s, nil
}

// ServeHTTP serves one request through the middleware chain and the route table. A request
// for a preview origin under BERTH_PREVIEW_DOMAIN never reaches Berth's middleware or routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := s.preview.ServiceForHost(r.Host); ok {
		s.preview.ServeHost(w, r, id)
		return
	}
	s.handler.ServeHTTP(w, r)
}

// Close stops the preview origins' listeners and the health check's own connection.
func (s *Server) Close() {
	if s.prober != nil {
		s.prober.Close()
	}
	s.preview.Close()
}

// secure reports whether Berth is served over https.
func (s *Server) secure() bool { return s.baseURL.Scheme == "https" }

// background gives work that must finish even if the client went away (audit writes).
func background(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
}
