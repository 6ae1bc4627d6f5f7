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

	"berth/db"
	"berth/environment/jail"
	"berth/environment/netns"
	"berth/handlers"
	"berth/handlers/preview"
	"berth/jobs"
	"berth/static"
	"berth/terminal"
	"berth/workspace"
)

// serve runs the web server (web=true) or a worker node (web=false) until ctx ends, then shuts
// down in reverse order: HTTP, jobs, database.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, web bool) error {
	name := "serve"
	if !web {
		name = "worker"
	}
	fs := flagSet(name, stderr)
	c := baseConfig(fs, getenv)
	workersDefault, err := envBool(getenv, "BERTH_WORKERS", true)
	if err != nil {
		return err
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
		return err
	}
	if err := c.finish(getenv, getenv("BERTH_BASE_URL")); err != nil {
		return err
	}
	if !web {
		c.Workers = true
	}
	// A warning or error repeats at most once per window (a database outage floods them).
	log := rateLimitLogs(c.newLogger(stderr, c.LogLevel), logRepeatWindow)
	started := time.Now()

	d, err := openDatabase(ctx, c, log, true)
	if err != nil {
		return err
	}
	defer d.close()

	key, err := db.LoadSecretKey(getenv("BERTH_SECRET_KEY"), c.DataDir)
	if err != nil {
		return err
	}
	sealer, err := db.NewSealer(key)
	if err != nil {
		return err
	}
	deps0, err := jailDeps(ctx, log, c.DataDir)
	if err != nil {
		return err
	}
	mgr, err := workspace.NewManager(c.DataDir, workspace.Options{CopyMaxBytes: c.CopyMaxBytes, CopyMaxFiles: c.CopyMaxFiles, Jail: deps0.Jail})
	if err != nil {
		return err
	}
	artifacts, err := workspace.NewArtifacts(c.DataDir)
	if err != nil {
		return err
	}
	apiURL := ""
	if c.BaseURL != nil {
		apiURL = c.BaseURL.String()
	}
	node, err := nodeID(getenv)
	if err != nil {
		return err
	}
	plugins, err := pluginHost(ctx, getenv, c.DataDir, log)
	if err != nil {
		return err
	}
	defer plugins.Close()
	executing := jobs.NewExecuting(node)
	defer executing.Close()
	metrics := handlers.NewMetrics() // this process's /metrics registry; the workers observe run admission
	// The egress proxy every jail with a network reaches (jobs/egress.go, docs/network.md).
	egressState, err := jobs.NewEgress(d.Pool, sealer, c.DataDir, log)
	if err != nil {
		return err
	}
	egressState.Denied = metrics.EgressDeniedInc
	// Every workspace's jails get a network namespace of their own when Berth is root
	// (environment/netns): Berth's API bridged to its loopback and the egress proxy, nothing of
	// the host's.
	networks, err := jailNetworks(deps0.Jail, c.BaseURL, egressState.Proxy)
	if err != nil {
		return err
	}
	if networks != nil {
		defer networks.Close()
	}
	deps := jobs.Deps{Pool: d.Pool, Log: log, Workspaces: mgr, Artifacts: artifacts, APIURL: apiURL, NodeID: node, Networks: networks,
		Egress:  egressState,
		Secrets: sealer, HomeDir: filepath.Join(c.DataDir, "homes"), Executing: executing,
		Jail: deps0.Jail, DataDir: deps0.DataDir, Masks: deps0.Masks, Admission: metrics.RunAdmission, Plugins: plugins}
	var local handlers.LocalServices // the preview proxy trusts this node's supervisor (handlers/preview/cache.go)
	var dialService func(context.Context, string, int) (net.Conn, error)
	if c.Workers {
		deps.Services = jobs.NewServices(deps)
		defer deps.Services.Close()
		local, dialService = deps.Services, deps.Services.DialService
	}
	client, err := jobs.NewClient(deps, jobs.ClientOptions{Work: c.Workers, MaxWorkers: c.MaxWorkers})
	if err != nil {
		return err
	}
	// The node registers (and opens its internal listener) before its client fetches (nodes.go).
	node0, err := startNode(ctx, nf, getenv, nodeStart{Log: log, Deps: deps, Client: client, Kind: name, Works: c.Workers, Secret: key})
	if err != nil {
		return err
	}
	defer node0.stop()
	if c.Workers {
		// The node claim comes before the first fetch, the startup sweep after the start: a
		// restarted node recovers its dead predecessor's runs at once (jobs/sweep.go).
		claimCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := executing.Claim(claimCtx, d.Pool)
		cancel()
		if err != nil {
			return err
		}
		if err := client.Start(ctx); err != nil {
			return fmt.Errorf("start jobs: %w", err)
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := client.Stop(stopCtx); err != nil {
				log.Warn("jobs did not stop cleanly", "err", err)
			}
		}()
		// Outcomes a stopped predecessor spooled are written (until done); the sweep leaves
		// their runs alone meanwhile (jobs/spool.go).
		go func() {
			if err := jobs.ReplaySpool(ctx, deps); err != nil && ctx.Err() == nil {
				log.Warn("run spool replay", "err", err)
			}
		}()
		sweepCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = jobs.SweepOrphans(sweepCtx, deps)
		cancel()
		if err != nil {
			log.Warn("startup orphan sweep", "err", err)
		}
	}

	if !web {
		if err := node0.serveWorker(handlers.Deps{Pool: d.Pool, Jobs: client, Secrets: sealer, Workspaces: mgr, Log: log,
			BaseURL: c.BaseURL, Version: version, Metrics: metrics, LocalServices: local, DialService: dialService}); err != nil {
			return err
		}
		log.Info("worker running", "startup_ms", time.Since(started).Milliseconds())
		<-ctx.Done()
		log.Info("worker stopping")
		return nil
	}

	origins, err := readPreviewOrigins(getenv, c.Addr)
	if err != nil {
		return err
	}
	admin, err := ensureAdmin(ctx, d.Pool, c)
	if err != nil {
		return err
	}
	if c.Demo {
		if err := seedDemo(ctx, d.Pool, c.DataDir); err != nil {
			return err
		}
	}
	assets, err := static.New()
	if err != nil {
		return err
	}
	// Live pages: one dedicated connection LISTENs for berth_events (docs/live.md).
	events := handlers.NewEvents(0)
	listener := &db.EventListener{Config: d.Pool.Config().ConnConfig, Log: log, OnEvent: events.Publish, OnListen: events.Listening}
	go func() { _ = listener.Run(ctx) }()
	srv, err := handlers.New(handlers.Deps{Pool: d.Pool, Jobs: client, Assets: assets, Secrets: sealer, SourceRoots: sourceRoots(getenv), Workspaces: mgr, Artifacts: artifacts, Log: log, BaseURL: c.BaseURL, Version: version, TrustedProxies: c.TrustedProxies,
		ImageSetup: &handlers.ImageSetup{DataDir: deps0.DataDir, Jail: deps0.Jail, Terminals: terminal.NewRegistry(terminal.Options{}), Plugins: plugins}, Metrics: metrics, MetricsToken: c.MetricsToken, LocalServices: local, Events: events,
		Nodes: node0.handlerNodes(), DialService: dialService, OnEnvironmentChange: egressState.Invalidate, HostChecks: hostChecks(deps0, *c),
		PreviewDomain: origins.Domain, PreviewPorts: origins.Ports, PreviewBind: origins.Bind, PreviewKey: handlers.PreviewKey(key)})
	if err != nil {
		return err
	}
	defer srv.Close()
	node0.serveInternal(srv)

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
		ErrorLog:          nil,
	}
	hs.RegisterOnShutdown(srv.CloseMCP) // and the MCP sessions' streams
	hs.RegisterOnShutdown(events.Close) // end the live pages' streams: Shutdown waits for handlers
	log.Info("berth serving", "addr", ln.Addr().String(), "workers", c.Workers, "startup_ms", time.Since(started).Milliseconds())
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
	log.Info("berth stopping")
	shutCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	return nil
}

// nodeID names this process's node on process-bound rows: BERTH_NODE_ID, else the host name.
// Two working processes on one host need distinct BERTH_NODE_IDs (the second would otherwise
// not recover the first's orphans at once, see jobs.Executing).
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
	d := jobs.Deps{DataDir: real}
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
