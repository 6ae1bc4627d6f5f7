package main

// This process as a node (DESIGN §11, docs/scaling.md): its row in the registry, its heartbeat
// and dead-node takeover loop, and its internal listener for node-to-node requests.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/handlers"
	"berth/jobs"
	"berth/jobs/nodes"
	"berth/static"
)

// nodeFlags are the node options of serve and worker.
type nodeFlags struct {
	internalAddr string
	internalURL  string
}

// addNodeFlags registers --internal-addr (BERTH_INTERNAL_ADDR) and --internal-url
// (BERTH_INTERNAL_URL).
func addNodeFlags(fs *flag.FlagSet, getenv func(string) string) *nodeFlags {
	f := &nodeFlags{}
	fs.StringVar(&f.internalAddr, "internal-addr", getenv("BERTH_INTERNAL_ADDR"),
		"node-to-node listen address HOST:PORT, for previews and terminals forwarded by web nodes (BERTH_INTERNAL_ADDR)")
	fs.StringVar(&f.internalURL, "internal-url", getenv("BERTH_INTERNAL_URL"),
		"how other nodes reach --internal-addr (default http://HOST:PORT of it; BERTH_INTERNAL_URL)")
	return f
}

// nodeTiming reads BERTH_NODE_HEARTBEAT, BERTH_NODE_DEAD_AFTER and BERTH_NODE_TAKEOVER_EVERY (Go
// durations); unset ones keep DESIGN §11's 5 s, 30 s and 10 s.
func nodeTiming(getenv func(string) string) (nodes.Timing, error) {
	t := nodes.DefaultTiming()
	for _, v := range []struct {
		name string
		dst  *time.Duration
	}{{"BERTH_NODE_HEARTBEAT", &t.Heartbeat}, {"BERTH_NODE_DEAD_AFTER", &t.DeadAfter}, {"BERTH_NODE_TAKEOVER_EVERY", &t.Takeover}} {
		s := strings.TrimSpace(getenv(v.name))
		if s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 100*time.Millisecond || d > time.Hour {
			return t, fmt.Errorf("%s %q: use a duration between 100ms and 1h, like 5s", v.name, s)
		}
		*v.dst = d
	}
	if t.DeadAfter < 2*t.Heartbeat {
		return t, fmt.Errorf("BERTH_NODE_DEAD_AFTER (%s) must be at least twice BERTH_NODE_HEARTBEAT (%s)", t.DeadAfter, t.Heartbeat)
	}
	return t, nil
}

// nodeProc is this process's node while it runs.
type nodeProc struct {
	id      string
	log     *slog.Logger
	timing  nodes.Timing
	key     []byte
	ln      net.Listener // the internal listener; nil without --internal-addr
	url     string
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	hs      *http.Server
	closeFn func()
}

// nodeStart is what starting a node needs from serve.
type nodeStart struct {
	Log    *slog.Logger
	Deps   jobs.Deps
	Client *river.Client[pgx.Tx]
	Kind   string
	Works  bool
	// Capacity is the runs this node executes at once (--max-workers) when it works.
	Capacity int
	Secret   []byte
}

// startNode opens the internal listener (so its URL is known), registers this node's new life
// and starts its heartbeat and takeover loop. Call it before the River client starts.
func startNode(ctx context.Context, f *nodeFlags, getenv func(string) string, s nodeStart) (*nodeProc, error) {
	timing, err := nodeTiming(getenv)
	if err != nil {
		return nil, err
	}
	n := &nodeProc{id: s.Deps.NodeID, log: s.Log, timing: timing, key: handlers.NodeKey(s.Secret)}
	if f.internalAddr != "" {
		ln, err := net.Listen("tcp", f.internalAddr)
		if err != nil {
			return nil, fmt.Errorf("internal listener on %s: %w (set --internal-addr / BERTH_INTERNAL_ADDR to another address)", f.internalAddr, err)
		}
		n.ln = ln
		if n.url, err = internalURL(f.internalURL, ln.Addr().String()); err != nil {
			_ = ln.Close()
			return nil, err
		}
	}
	reg := db.NodeRegistration{ID: n.id, Kind: s.Kind, InternalURL: n.url, Version: version, Works: s.Works}
	if s.Works {
		reg.Capacity = max(s.Capacity, 1)
	}
	keeper := nodes.NewKeeper(nodes.Deps{Pool: s.Deps.Pool, Log: s.Deps.Log, NodeID: s.Deps.NodeID,
		Sweep: jobs.NodeSweep(s.Deps, s.Client), Recovery: s.Deps.Recovery}, reg, timing)
	regCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = keeper.Register(regCtx)
	cancel()
	if err != nil {
		n.closeListener()
		return nil, err
	}
	loopCtx, stop := context.WithCancel(ctx)
	n.cancel = stop
	n.wg.Add(1)
	go func() { defer n.wg.Done(); keeper.Run(loopCtx) }()
	s.Log.Info("node registered", "node", n.id, "kind", s.Kind, "internal_url", n.url, "dead_after", timing.DeadAfter.String())
	return n, nil
}

// internalURL is how other nodes reach the internal listener at addr: the configured URL, else
// http://addr (a wildcard address is named by this host's name).
func internalURL(configured, addr string) (string, error) {
	if configured != "" {
		if !strings.HasPrefix(configured, "http://") && !strings.HasPrefix(configured, "https://") {
			return "", fmt.Errorf("BERTH_INTERNAL_URL %q: use http://HOST:PORT or https://HOST:PORT", configured)
		}
		return strings.TrimSuffix(configured, "/"), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("internal listener address %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("internal listener on a wildcard address: set BERTH_INTERNAL_URL (%w)", err)
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// handlerNodes is what the web server needs to know of this node.
func (n *nodeProc) handlerNodes() *handlers.Nodes {
	return &handlers.Nodes{Self: n.id, Key: n.key, DeadAfter: n.timing.DeadAfter}
}

// serveInternal serves srv's internal handler on the internal listener, if there is one.
func (n *nodeProc) serveInternal(srv *handlers.Server) {
	if n.ln == nil {
		return
	}
	n.hs = &http.Server{Handler: srv.InternalHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.hs.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("internal listener", "err", err)
		}
	}()
	n.log.Info("internal listener", "addr", n.ln.Addr().String(), "url", n.url)
}

// serveWorker builds a web server for a worker's internal listener (it serves forwarded
// previews of the services this node runs; the worker has no public listener).
func (n *nodeProc) serveWorker(d handlers.Deps) error {
	if n.ln == nil {
		return nil
	}
	assets, err := static.New()
	if err != nil {
		return err
	}
	d.Assets, d.Nodes = assets, n.handlerNodes()
	srv, err := handlers.New(d)
	if err != nil {
		return err
	}
	n.closeFn = srv.Close
	n.serveInternal(srv)
	return nil
}

func (n *nodeProc) closeListener() {
	if n.ln != nil {
		_ = n.ln.Close()
	}
}

// stop ends the loop and the internal listener. The row stays: its heartbeat stops, and a
// restart with the same id starts a new life.
func (n *nodeProc) stop() {
	if n == nil {
		return
	}
	if n.cancel != nil {
		n.cancel()
	}
	if n.hs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = n.hs.Shutdown(ctx)
		cancel()
	} else {
		n.closeListener()
	}
	n.wg.Wait()
	if n.closeFn != nil {
		n.closeFn()
	}
}
