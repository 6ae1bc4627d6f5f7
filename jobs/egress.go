package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/egress"
	"berth/environment/seal"
)

// Egress is this node's side of the egress proxy (docs/network.md): which environment and run
// each workspace namespace's jails belong to, the environments' policies (read for every new
// connection, from a cache of at most egressCacheTTL that a change through this node drops at
// once), and what each run reached and was refused: a line in the run's log, a step in the
// ledger and an audit event per refused host, a counter on /metrics, the list on the run page.
type Egress struct {
	pool    *pgxpool.Pool
	secrets *seal.Sealer
	log     *slog.Logger
	// Denied counts refusals by environment and reason class (berth_egress_denied_total).
	Denied func(environmentID, reason string)
	// Proxy is the node's proxy, serving every namespace (netns.Serve).
	Proxy *egress.Proxy

	mu      sync.Mutex
	tenants map[string]tenant     // by namespace key (execution workspace id)
	cache   map[string]cachedPol  // by environment id
	runs    map[string]*runEgress // by run id, while its command runs
	bundle  string                // the CA bundle jails trust (host path)
}

type tenant struct {
	companyID, environmentID string
	run                      *runEgress
}

type cachedPol struct {
	pol   egress.Policy
	until time.Time
}

// egressCacheTTL bounds how long another node's policy edit takes to reach this node's proxy.
const egressCacheTTL = time.Second

// runEgress is what one run's jails reached and were refused.
type runEgress struct {
	id, taskID, workspaceID string
	log                     io.Writer
	mu                      sync.Mutex
	hosts                   map[string]*EgressHost
}

// EgressHost is one host:port a run connected to, or tried to.
type EgressHost struct {
	Host    string `json:"host"`
	Port    int    `json:"port"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule"`
	Count   int    `json:"count"`
}

// NewEgress makes the node's egress side and its proxy. The per-install CA (for credential
// injection) is made on first start, its key sealed with the secret key, both in dataDir/egress.
func NewEgress(pool *pgxpool.Pool, secrets *seal.Sealer, data datadir.Layout, log *slog.Logger) (*Egress, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Egress{pool: pool, secrets: secrets, log: log, tenants: map[string]tenant{}, cache: map[string]cachedPol{},
		runs: map[string]*runEgress{}}
	e.Proxy = &egress.Proxy{Policy: e.policy, Observe: e.observe}
	if data.Root != "" && secrets != nil {
		ca, bundle, err := loadEgressCA(data.Egress(), secrets)
		if err != nil {
			return nil, err
		}
		e.Proxy.CA, e.bundle = ca, bundle
	}
	return e, nil
}

// Bundle is the host path of the certificate bundle (the system's roots and Berth's egress CA)
// jails of an environment with injected credentials trust; "" when there is none.
func (e *Egress) Bundle() string {
	if e == nil {
		return ""
	}
	return e.bundle
}

// Bind says that namespace key's jails belong to environment environmentID (of companyID) from
// now on; with a run, its connections are recorded for it until unbind.
func (e *Egress) Bind(key, companyID, environmentID string, run *db.Run, log io.Writer) (unbind func()) {
	if e == nil || key == "" {
		return func() {}
	}
	t := tenant{companyID: companyID, environmentID: environmentID}
	if run != nil {
		t.run = &runEgress{id: run.ID, taskID: run.TaskID, workspaceID: key, log: log, hosts: map[string]*EgressHost{}}
	}
	e.mu.Lock()
	e.tenants[key] = t
	if t.run != nil {
		e.runs[t.run.id] = t.run
	}
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if cur, ok := e.tenants[key]; ok && cur.run == t.run {
			cur.run = nil
			e.tenants[key] = cur
		}
		if t.run != nil {
			delete(e.runs, t.run.id)
		}
	}
}

// Invalidate drops environmentID's cached policy: the next connection reads it again.
func (e *Egress) Invalidate(environmentID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	delete(e.cache, environmentID)
	e.mu.Unlock()
}

// policy is the current policy of namespace key's environment.
func (e *Egress) policy(ctx context.Context, key string) (egress.Policy, error) {
	e.mu.Lock()
	t, ok := e.tenants[key]
	c, cached := e.cache[t.environmentID]
	e.mu.Unlock()
	if !ok {
		return egress.Policy{}, fmt.Errorf("egress: namespace %s belongs to no environment", key)
	}
	if cached && time.Now().Before(c.until) {
		return c.pol, nil
	}
	env, err := db.EnvironmentByID(ctx, e.pool, t.companyID, t.environmentID)
	if err != nil {
		return egress.Policy{}, err
	}
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return egress.Policy{}, err
	}
	var sec environment.Secrets
	if len(env.Secrets) > 0 && e.secrets != nil {
		b, err := e.secrets.Open(env.Secrets, environment.SecretsAAD(env.ID))
		if err != nil {
			return egress.Policy{}, errors.New("egress: the environment's secrets do not open")
		}
		if err := json.Unmarshal(b, &sec); err != nil {
			return egress.Policy{}, err
		}
	}
	pol, err := cfg.EgressPolicy(sec)
	if err != nil {
		return egress.Policy{}, err
	}
	if env.Status != db.EnvironmentActive {
		pol = egress.Policy{Mode: egress.ModeOff}
	}
	e.mu.Lock()
	e.cache[t.environmentID] = cachedPol{pol: pol, until: time.Now().Add(egressCacheTTL)}
	e.mu.Unlock()
	return pol, nil
}

// observe records a decided connection for the run that holds the namespace.
func (e *Egress) observe(key string, ev egress.Event) {
	e.mu.Lock()
	t := e.tenants[key]
	e.mu.Unlock()
	if !ev.Allowed && e.Denied != nil {
		e.Denied(t.environmentID, reasonClass(ev.Rule))
	}
	r := t.run
	if r == nil {
		return
	}
	hp := ev.Host + ":" + strconv.Itoa(ev.Port)
	k := hp + "|" + strconv.FormatBool(ev.Allowed) // reached and refused are two entries
	r.mu.Lock()
	h, seen := r.hosts[k]
	if !seen {
		h = &EgressHost{Host: ev.Host, Port: ev.Port, Allowed: ev.Allowed, Rule: ev.Rule}
		r.hosts[k] = h
	}
	h.Count++
	first := !seen && !ev.Allowed
	r.mu.Unlock()
	if ev.Allowed {
		return
	}
	if r.log != nil {
		fmt.Fprintf(r.log, "egress denied: %s (%s)\n", hp, ev.Rule)
	}
	if first { // one ledger step and one audit event per refused host of a run
		go e.recordDenied(t, r, hp, ev)
	}
}

// recordDenied writes a refused connection to the workspace's ledger and the audit trail.
func (e *Egress) recordDenied(t tenant, r *runEgress, hp string, ev egress.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := db.StartOperation(ctx, e.pool, db.NewOperation{CompanyID: t.companyID, ExecutionWorkspaceID: r.workspaceID,
		RunID: r.id, TaskID: r.taskID, Phase: "egress", Command: ev.Via + " " + hp})
	if err == nil {
		err = db.FinishOperation(ctx, e.pool, op.ID, db.OperationResult{Status: "failed", Error: "egress denied: " + hp + " (" + ev.Rule + ")"})
	}
	if err != nil {
		e.log.Warn("egress ledger", "run_id", r.id, "err", err)
	}
	if err := db.InsertAudit(ctx, e.pool, db.AuditEvent{CompanyID: t.companyID, ActorType: "system", ActorLabel: "run " + r.id,
		Action: "egress.denied", TargetType: "run", TargetID: r.id,
		Details: map[string]any{"host": ev.Host, "port": ev.Port, "rule": ev.Rule, "via": ev.Via, "environment_id": t.environmentID}}); err != nil {
		e.log.Warn("egress audit", "run_id", r.id, "err", err)
	}
}

// Hosts is what run id reached and was refused so far, sorted by host and port.
func (e *Egress) Hosts(runID string) []EgressHost {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	r := e.runs[runID]
	e.mu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]EgressHost, 0, len(r.hosts))
	for _, h := range r.hosts {
		out = append(out, *h)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Allowed && !out[j].Allowed
	})
	return out
}

// reasonClass is a refusal's reason without its particulars, for a metric label.
func reasonClass(rule string) string {
	for _, c := range []string{"deny", "private address", "not on the allowlist", "mode off", "no address", "request already carries"} {
		if strings.HasPrefix(rule, c) {
			return strings.ReplaceAll(c, " ", "_")
		}
	}
	return "other"
}

// loadEgressCA reads (or makes, on first start) the per-install CA in dir: ca.pem, ca-key.sealed
// (the key sealed with the secret key) and ca-bundle.pem (the system's roots plus ca.pem), and
// returns it with the bundle's path.
func loadEgressCA(dir string, secrets *seal.Sealer) (*egress.CA, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("egress ca: %w", err)
	}
	certPath, keyPath, bundle := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.sealed"), filepath.Join(dir, "ca-bundle.pem")
	const aad = "egress-ca"
	var ca *egress.CA
	cert, cerr := os.ReadFile(certPath)
	sealed, kerr := os.ReadFile(keyPath)
	switch {
	case cerr == nil && kerr == nil:
		key, err := secrets.Open(sealed, aad)
		if err != nil {
			return nil, "", fmt.Errorf("egress ca: its key does not open with this server's secret key")
		}
		if ca, err = egress.LoadCA(cert, key); err != nil {
			return nil, "", err
		}
	case errors.Is(cerr, fs.ErrNotExist) || errors.Is(kerr, fs.ErrNotExist):
		var err error
		if ca, err = egress.NewCA("Berth egress CA"); err != nil {
			return nil, "", err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return nil, "", err
		}
		if sealed, err = secrets.Seal(key, aad); err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(keyPath, sealed, 0o600); err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(certPath, ca.CertPEM(), 0o644); err != nil {
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("egress ca: %w", errors.Join(cerr, kerr))
	}
	var roots []byte
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"} {
		if b, err := os.ReadFile(p); err == nil {
			roots = b
			break
		}
	}
	body := slices.Concat(roots, []byte("\n"), ca.CertPEM())
	if err := os.WriteFile(bundle, body, 0o644); err != nil {
		return nil, "", fmt.Errorf("egress ca bundle: %w", err)
	}
	return ca, bundle, nil
}
