package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/environment/netns"
	"berth/environment/seal"
	"berth/handlers"
	"berth/handlers/live"
	"berth/handlers/metrics"
	"berth/handlers/preview"
	"berth/jobs"
	"berth/jobs/executing"
	"berth/static"
	"berth/terminal"
	"berth/terminal/imagesetup"
	"berth/workspace"
	"berth/workspace/receipt"
)

// serve runs the web server (web=true) or a worker node (web=false) until ctx ends, in named
// steps: read the configuration, open the node's parts (database, key, jail, workspaces,
// plugins, egress, networks), start its work (node registration, River, recovery), then serve
// (the web listener, or only the worker's internal one). Every part started is stopped in
// reverse order on the way out: HTTP, jobs, database.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, web bool) error {
	c, nf, err := serveConfig(args, getenv, stderr, web)
	if err != nil {
		return err
	}
	// A warning or error repeats at most once per window (a database outage floods them).
	log := rateLimitLogs(c.newLogger(stderr, c.LogLevel), logRepeatWindow)
	started := time.Now()
	var stops stack
	defer stops.run()

	n, err := openParts(ctx, c, getenv, log, &stops)
	if err != nil {
		return err
	}
	if err := n.startWork(ctx, nf, getenv, web, &stops); err != nil {
		return err
	}
	if !web {
		return n.runWorker(ctx, started)
	}
	return n.runWeb(ctx, getenv, stdout, started, &stops)
}

// stack is what a serve step started, stopped last-first.
type stack []func()

func (s *stack) push(stop func()) { *s = append(*s, stop) }

func (s *stack) run() {
	for i := len(*s) - 1; i >= 0; i-- {
		(*s)[i]()
	}
}

// serveConfig reads serve's or worker's flags and environment.
func serveConfig(args []string, getenv func(string) string, stderr io.Writer, web bool) (*config, *nodeFlags, error) {
	name := "serve"
	if !web {
		name = "worker"
	}
	fs := flagSet(name, stderr)
	c := baseConfig(fs, getenv)
	workersDefault, err := envBool(getenv, "BERTH_WORKERS", true)
	if err != nil {
		return nil, nil, err
	}
	fs.BoolVar(&c.Workers, "workers", workersDefault, "run job workers in this process (BERTH_WORKERS)")
	fs.IntVar(&c.MaxWorkers, "max-workers", 20, "concurrent jobs on this node")
	addrDefault := getenv("BERTH_ADDR")
	if addrDefault == "" {
		addrDefault = "127.0.0.1:8080"
	}
	if web {
		fs.StringVar(&c.Addr, "addr", addrDefault, "listen address (BERTH_ADDR)")
		fs.BoolVar(&c.Demo, "demo", false, "seed a demo company on a fresh install")
	}
	nf := addNodeFlags(fs, getenv) // --internal-addr, --internal-url (nodes.go)
	if err := parseFlags(fs, args, stderr); err != nil {
		return nil, nil, err
	}
	if err := c.finish(getenv, getenv("BERTH_BASE_URL")); err != nil {
		return nil, nil, err
	}
	if !web {
		c.Workers = true
	}
	return c, nf, nil
}

// parts are what one serve or worker process is made of, for the steps after openParts.
type parts struct {
	c          *config
	log        *slog.Logger
	db         *database
	key        []byte
	sealer     *seal.Sealer
	receiptKey []byte    // signs run receipts (workspace/receipt), derived from key
	host       jobs.Deps // the jail and what it masks (jailDeps)
	plugins    *environment.PluginHost
	executing  *executing.Registry
	metrics    *metrics.Registry
	egress     *jobs.Egress
	deps       jobs.Deps // what the workers get
	client     *river.Client[pgx.Tx]
	node       *nodeProc
	// local and dialService reach this node's runtime services (nil without workers).
	local       handlers.LocalServices
	dialService func(context.Context, string, int) (net.Conn, error)
}

// openParts opens the database and builds what the node's work needs: the secret key, its
// sealer and the receipt key derived from it, the jail, the workspace manager and artifact
// store, the plugin host, the run registry, the metrics registry, the egress proxy and the
// jails' network namespaces.
func openParts(ctx context.Context, c *config, getenv func(string) string, log *slog.Logger, stops *stack) (*parts, error) {
	n := &parts{c: c, log: log}
	var err error
	if n.db, err = openDatabase(ctx, c, log, true); err != nil {
		return nil, err
	}
	stops.push(n.db.close)
	if n.key, err = seal.LoadKey(getenv("BERTH_SECRET_KEY"), c.DataDir); err != nil {
		return nil, err
	}
	if n.sealer, err = seal.New(n.key); err != nil {
		return nil, err
	}
	n.receiptKey = receipt.DeriveKey(n.key)
	if n.host, err = jailDeps(ctx, log, c.DataDir); err != nil {
		return nil, err
	}
	mgr, err := workspace.NewManager(c.DataDir, workspace.Options{CopyMaxBytes: c.CopyMaxBytes, CopyMaxFiles: c.CopyMaxFiles, Jail: n.host.Jail})
	if err != nil {
		return nil, err
	}
	artifacts, err := workspace.NewArtifacts(c.DataDir)
	if err != nil {
		return nil, err
	}
	nodeName, err := nodeID(getenv)
	if err != nil {
		return nil, err
	}
	if n.plugins, err = pluginHost(ctx, getenv, c.DataDir, log); err != nil {
		return nil, err
	}
	stops.push(func() { _ = n.plugins.Close() })
	n.executing = executing.New(nodeName)
	stops.push(n.executing.Close)
	n.metrics = metrics.New() // this process's /metrics registry; the workers observe run admission
	// The egress proxy every jail with a network reaches (jobs/egress.go, docs/network.md).
	if n.egress, err = jobs.NewEgress(n.db.Pool, n.sealer, n.host.Data, log); err != nil {
		return nil, err
	}
	n.egress.Denied = n.metrics.EgressDeniedInc
	// Every workspace's jails get a network namespace of their own when Berth is root
	// (environment/netns): Berth's API bridged to its loopback and the egress proxy, nothing of
	// the host's.
	networks, err := jailNetworks(n.host.Jail, c.BaseURL, n.egress.Proxy)
	if err != nil {
		return nil, err
	}
	if networks != nil {
		stops.push(networks.Close)
	}
	apiURL := ""
	if c.BaseURL != nil {
		apiURL = c.BaseURL.String()
	}
	n.deps = jobs.Deps{
		Pool:       n.db.Pool,
		Log:        log,
		Workspaces: mgr,
		Artifacts:  artifacts,
		APIURL:     apiURL,
		NodeID:     nodeName,
		Networks:   networks,
		Egress:     n.egress,
		Secrets:    n.sealer,
		ReceiptKey: n.receiptKey,
		HomeDir:    n.host.Data.Homes(),
		Executing:  n.executing,
		Unmanaged:  new(jobs.UnmanagedMemo),
		Recovery:   new(db.RecoveryMemo),
		Jail:       n.host.Jail,
		Data:       n.host.Data,
		Masks:      n.host.Masks,
		Admission:  n.metrics.RunAdmission,
		Plugins:    n.plugins,
	}
	return n, nil
}

// startWork starts the runtime-service supervisor (with workers), builds the River client,
// registers the node (its internal listener opens before the client fetches, nodes.go), and,
// with workers, claims the node, starts River and recovers: the spool a stopped predecessor left
// and the startup orphan sweep.
func (n *parts) startWork(ctx context.Context, nf *nodeFlags, getenv func(string) string, web bool, stops *stack) error {
	if n.c.Workers {
		n.deps.Services = jobs.NewServices(n.deps)
		stops.push(n.deps.Services.Close)
		n.local, n.dialService = n.deps.Services, n.deps.Services.DialService
	}
	var err error
	if n.client, err = jobs.NewClient(n.deps, jobs.ClientOptions{Work: n.c.Workers, MaxWorkers: n.c.MaxWorkers}); err != nil {
		return err
	}
	kind := "serve"
	if !web {
		kind = "worker"
	}
	n.node, err = startNode(ctx, nf, getenv, nodeStart{Log: n.log, Deps: n.deps, Client: n.client, Kind: kind, Works: n.c.Workers,
		Capacity: n.c.MaxWorkers, Secret: n.key})
	if err != nil {
		return err
	}
	stops.push(n.node.stop)
	if !n.c.Workers {
		return nil
	}
	// The node claim comes before the first fetch, the startup sweep after the start: a
	// restarted node recovers its dead predecessor's runs at once (jobs/sweep.go).
	claimCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = n.executing.Claim(claimCtx, n.db.Pool)
	cancel()
	if err != nil {
		return err
	}
	if err := n.client.Start(ctx); err != nil {
		return fmt.Errorf("start jobs: %w", err)
	}
	stops.push(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.client.Stop(stopCtx); err != nil {
			n.log.Warn("jobs did not stop cleanly", "err", err)
		}
	})
	// Outcomes a stopped predecessor spooled are written (until done); the sweep leaves their
	// runs alone meanwhile (package jobs/spool).
	go func() {
		if err := jobs.ReplaySpool(ctx, n.deps); err != nil && ctx.Err() == nil {
			n.log.Warn("run spool replay", "err", err)
		}
	}()
	sweepCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = jobs.SweepOrphans(sweepCtx, n.deps)
	cancel()
	if err != nil {
		n.log.Warn("startup orphan sweep", "err", err)
	}
	return nil
}

// runWorker serves a worker's internal listener (forwarded previews of the services it runs)
// until ctx ends.
func (n *parts) runWorker(ctx context.Context, started time.Time) error {
	err := n.node.serveWorker(handlers.Deps{
		Pool:          n.db.Pool,
		Jobs:          n.client,
		Secrets:       n.sealer,
		ReceiptKey:    n.receiptKey,
		Workspaces:    n.deps.Workspaces,
		Log:           n.log,
		BaseURL:       n.c.BaseURL,
		Version:       version,
		Metrics:       n.metrics,
		LocalServices: n.local,
		DialService:   n.dialService,
	})
	if err != nil {
		return err
	}
	n.log.Info("worker running", "startup_ms", time.Since(started).Milliseconds())
	<-ctx.Done()
	n.log.Info("worker stopping")
	return nil
}

// runWeb makes sure of the admin (and the demo), starts the live pages' listener and the River
// UI under ctx, builds the web server, opens the listener, prints the banner and serves until
// ctx ends; then shuts HTTP down within 15 s.
func (n *parts) runWeb(ctx context.Context, getenv func(string) string, stdout io.Writer, started time.Time, stops *stack) error {
	c := n.c
	origins, err := readPreviewOrigins(getenv, c.Addr)
	if err != nil {
		return err
	}
	admin, err := ensureAdmin(ctx, n.db.Pool, c)
	if err != nil {
		return err
	}
	if c.Demo {
		if err := seedDemo(ctx, n.db.Pool, c.DataDir); err != nil {
			return err
		}
	}
	assets, err := static.New()
	if err != nil {
		return err
	}
	// Live pages: one dedicated connection LISTENs for berth_events (docs/live.md).
	events := live.New(0)
	listener := &db.EventListener{Config: n.db.Pool.Config().ConnConfig, Log: n.log, OnEvent: events.Publish, OnListen: events.Listening}
	go func() { _ = listener.Run(ctx) }()
	jobsUI, err := handlers.NewJobsUI(ctx, n.client, n.log) // its background services end with ctx
	if err != nil {
		return err
	}
	imageSetup := &handlers.ImageSetup{Plugins: n.plugins, Sessions: imagesetup.Sessions{Data: n.host.Data, Jail: n.host.Jail,
		Terminals: terminal.NewRegistry(terminal.Options{})}}
	srv, err := handlers.New(handlers.Deps{
		Pool:                n.db.Pool,
		Jobs:                n.client,
		JobsUI:              jobsUI,
		Assets:              assets,
		Secrets:             n.sealer,
		ReceiptKey:          n.receiptKey,
		SourceRoots:         sourceRoots(getenv),
		Workspaces:          n.deps.Workspaces,
		Artifacts:           n.deps.Artifacts,
		Log:                 n.log,
		BaseURL:             c.BaseURL,
		Version:             version,
		TrustedProxies:      c.TrustedProxies,
		ImageSetup:          imageSetup,
		Metrics:             n.metrics,
		MetricsToken:        c.MetricsToken,
		LocalServices:       n.local,
		Events:              events,
		Nodes:               n.node.handlerNodes(),
		DialService:         n.dialService,
		OnEnvironmentChange: n.egress.Invalidate,
		HostChecks:          hostChecks(n.host, *c),
		PreviewDomain:       origins.Domain,
		PreviewPorts:        origins.Ports,
		PreviewBind:         origins.Bind,
		PreviewKey:          handlers.PreviewKey(n.key),
	})
	if err != nil {
		return err
	}
	stops.push(srv.Close)
	n.node.serveInternal(srv)

	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (set BERTH_ADDR to another address)", c.Addr, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	hs.RegisterOnShutdown(srv.CloseMCP) // and the MCP sessions' streams
	hs.RegisterOnShutdown(events.Close) // end the live pages' streams: Shutdown waits for handlers
	n.log.Info("berth serving", "addr", ln.Addr().String(), "workers", c.Workers, "startup_ms", time.Since(started).Milliseconds())
	printBanner(stdout, c, origins, admin)

	// Serve only after the banner: whoever sees /api/health answer has seen the login too.
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	case <-ctx.Done():
	}
	n.log.Info("berth stopping")
	shutCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		n.log.Warn("http shutdown", "err", err)
	}
	return nil
}

// printBanner tells whoever ran `berth serve` where Berth is and how to sign in.
func printBanner(stdout io.Writer, c *config, origins previewOrigins, admin firstAdmin) {
	fmt.Fprintf(stdout, "\nBerth is running at %s\n", c.BaseURL)
	fmt.Fprintf(stdout, "  %s\n", origins.describe(preview.PortURLHost(c.BaseURL.Hostname())))
	if admin.created {
		fmt.Fprintf(stdout, "  sign in as %s\n", admin.email)
		if admin.password != "" {
			fmt.Fprintf(stdout, "  password:  %s   (generated; shown only this once)\n", admin.password)
		} else {
			fmt.Fprintln(stdout, "  password:  the one in BERTH_ADMIN_PASSWORD")
		}
	} else {
		printPasswordReset(stdout, c.AdminEmail)
	}
	fmt.Fprintln(stdout)
}

// nodeID names this process's node on process-bound rows: BERTH_NODE_ID, else the host name.
// Two working processes on one host need distinct BERTH_NODE_IDs (the second would otherwise
// not recover the first's orphans at once, see package jobs/executing).
func nodeID(getenv func(string) string) (string, error) {
	if id := getenv("BERTH_NODE_ID"); id != "" {
		if !validNodeID(id) {
			return "", fmt.Errorf("BERTH_NODE_ID %q: use 1 to 64 letters, digits, '.', '_' or '-'", id)
		}
		return id, nil
	}
	h, err := os.Hostname()
	if err != nil || !validNodeID(h) {
		return "node", nil
	}
	return h, nil
}

// validNodeID accepts 1 to 64 bytes of letters, digits, '.', '_' and '-' (a host name fits).
func validNodeID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// sourceRoots reads BERTH_SOURCE_ROOTS: colon-separated absolute directories under which board
// members may point local project workspace sources.
func sourceRoots(getenv func(string) string) []string {
	var roots []string
	for _, r := range strings.Split(getenv("BERTH_SOURCE_ROOTS"), ":") {
		if r = strings.TrimSpace(r); filepath.IsAbs(r) {
			roots = append(roots, filepath.Clean(r))
		}
	}
	return roots
}

// jailNetworks is this node's workspace network namespaces, when it has a jail and is root (nil
// otherwise: jails then keep the host's network, docs/network.md).
func jailNetworks(h *jail.Host, api *url.URL, proxy netns.Egress) (*netns.Networks, error) {
	if h == nil || !netns.Available() {
		return nil, nil
	}
	n, err := netns.NewNetworks(netns.Serve(api, proxy))
	if err != nil {
		return nil, fmt.Errorf("network namespaces: %w", err)
	}
	return n, nil
}

// jailDeps finds this host's jail (bubblewrap, and the berth-run user when Berth is root) and
// what every jailed command must not see: the data dir and the server user's home. Without
// bubblewrap Berth still starts (pages, API), and runs on contained environments are refused as
// environment_unavailable with the fix.
func jailDeps(ctx context.Context, log *slog.Logger, dataDir string) (jobs.Deps, error) {
	real, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		return jobs.Deps{}, fmt.Errorf("data dir: %w", err)
	}
	d := jobs.Deps{Data: datadir.At(real)}
	if home, err := os.UserHomeDir(); err == nil && filepath.IsAbs(home) && home != "/" {
		if h, err := filepath.EvalSymlinks(home); err == nil && h != "/" {
			d.Masks = append(d.Masks, h)
		}
	}
	h, err := jail.Detect(ctx)
	if err != nil {
		log.Warn("runs on contained environments are refused until this is fixed", "error", err)
		return d, nil
	}
	d.Jail = &h
	return d, nil
}
