// Package jobs holds Berth's background work on River: one file per job kind (its args and its
// idempotent worker), and this file, which registers the workers and the periodic schedule and
// builds the client. Jobs are enqueued with InsertTx inside the transaction of the state change
// that needs them, so a rolled-back change never leaves a job behind. The long-lived parts the
// kinds work through have packages of their own below, none of which imports jobs:
// jobs/services (runtime services), jobs/nodes (heartbeat and dead-node takeover),
// jobs/executing (this process's runs and node claim) and jobs/spool (run outcomes kept through
// a database outage).
package jobs

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/environment/netns"
	"berth/environment/seal"
	"berth/jobs/executing"
	"berth/jobs/services"
	"berth/workspace"
)

// Deps are what workers need from the process that runs them.
type Deps struct {
	Pool *pgxpool.Pool
	Log  *slog.Logger
	// Workspaces realizes and finalizes execution workspaces on this node's disk.
	Workspaces *workspace.Manager
	// Artifacts keeps capsules of copy workspaces, outside every workspace, by content digest.
	Artifacts *workspace.Artifacts
	// APIURL is given to run commands as BERTH_API_URL.
	APIURL string
	// NodeID names this node on process-bound rows (runs, operations).
	NodeID string
	// Secrets opens environments' sealed secrets for their drivers.
	Secrets *seal.Sealer
	// ReceiptKey signs the receipts finalize writes (workspace/receipt, derived from the secret
	// key by cmd/berth); empty writes none.
	ReceiptKey []byte
	// HomeDir holds a private HOME per environment for commands (outside every workspace, so
	// dotfiles never land in a task's commits).
	HomeDir string
	// Jail is this host's bubblewrap and run user (jail.Detect); nil when bubblewrap is missing,
	// and then contained environments refuse to run commands (environment_unavailable).
	Jail *jail.Host
	// Data is Berth's data dir and the paths under it (cmd/berth makes it); with Masks (the
	// server user's home) its root is hidden from every jailed command.
	Data  datadir.Layout
	Masks []string
	// Networks are this node's workspace network namespaces (environment/netns): every jail of a
	// workspace joins its workspace's, with Berth's API and egress proxy on its loopback. Nil when
	// Berth is not root (jails then have the host's network).
	Networks *netns.Networks
	// Egress is this node's side of the egress proxy (egress.go): policies, the per-run record
	// of hosts, the CA. Nil is allowed (the proxy then refuses everything: netns.Serve).
	Egress *Egress
	// Executing is this process's registry of the runs it executes, its River client id and its
	// claim on NodeID (package jobs/executing); NewClient makes one when it is nil. Pass the same
	// one to SweepOrphans.
	Executing *executing.Registry
	// Unmanaged is what this process remembers of its unmanaged-directory reports
	// (unmanaged_report.go); NewClient makes one when it is nil, and a sweep without one writes
	// no report. Pass the same one to SweepOrphans.
	Unmanaged *UnmanagedMemo
	// Recovery is this node's heartbeat answer to db.RecoveryDue, which the periodic gate reads
	// before asking the database itself (periodic.go); pass the same one to the node keeper
	// (nodes.Deps.Recovery). Nil: the gate asks at every tick.
	Recovery *db.RecoveryMemo
	// Services runs this process's runtime services (package jobs/services, NewServices);
	// Workers makes one when it is nil.
	Services *services.Supervisor
	// Admission, when set, observes each run's wait from its creation to the start of its
	// command, in seconds, as the run starts (berth_run_admission_to_start_seconds on /metrics).
	Admission Observer
	// Plugins runs the plugin processes of plugin environments (BERTH_PLUGIN_DIR); nil when
	// plugins are off on this node, and then plugin environments are environment_unavailable.
	Plugins *environment.PluginHost
	// LeaseTTL is how long a running command's lease lives without a renewal (default 2 min);
	// the executor renews every third of it and stops the command when a whole one passes
	// without a renewal (jobs/leases.go leaseKeeper).
	LeaseTTL time.Duration
}

// leaseTTL is d.LeaseTTL or the default.
func (d Deps) leaseTTL() time.Duration {
	if d.LeaseTTL > 0 {
		return d.LeaseTTL
	}
	return leaseTTL
}

// Observer takes one observation (a prometheus.Histogram is one).
type Observer interface{ Observe(float64) }

// Workers registers every job kind Berth knows.
func Workers(d Deps) (*river.Workers, error) {
	w := river.NewWorkers()
	if d.Services == nil {
		d.Services = NewServices(d)
	}
	if err := river.AddWorkerSafely(w, &HousekeepingWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register housekeeping: %w", err)
	}
	rw := runWorker{deps: d}
	if err := river.AddWorkerSafely(w, &ProvisionWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register provision: %w", err)
	}
	if err := river.AddWorkerSafely(w, &ExecuteRunWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register execute_run: %w", err)
	}
	if err := river.AddWorkerSafely(w, &FinalizeWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register finalize: %w", err)
	}
	// Recovery: orphan sweeps, lease expiry and cleanup (sweep.go, leases.go).
	if err := river.AddWorkerSafely(w, &SweepOrphansWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register sweep_orphans: %w", err)
	}
	if err := river.AddWorkerSafely(w, &ExpireLeasesWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register expire_leases: %w", err)
	}
	if err := river.AddWorkerSafely(w, &CleanupLeaseWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register cleanup_lease: %w", err)
	}
	// Execution workspace close and reopen (close_workspace.go).
	if err := river.AddWorkerSafely(w, &CloseWorkspaceWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register close_workspace: %w", err)
	}
	if err := river.AddWorkerSafely(w, &ReopenWorkspaceWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register reopen_workspace: %w", err)
	}
	// Attempt decisions' git side (select_attempts.go).
	if err := river.AddWorkerSafely(w, &SelectAttemptsWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register select_attempts: %w", err)
	}
	// Environment probes (probe_environment.go).
	if err := river.AddWorkerSafely(w, &ProbeEnvironmentWorker{runWorker: rw}); err != nil {
		return nil, fmt.Errorf("jobs: register probe_environment: %w", err)
	}
	// Custom images: capture a setup session's layer, time out expired sessions (capture_image.go,
	// expire_setup_sessions.go).
	if err := river.AddWorkerSafely(w, &CaptureImageWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register capture_image: %w", err)
	}
	// OCI images imported from the environment page (import_image.go).
	if err := river.AddWorkerSafely(w, &ImportImageWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register import_image: %w", err)
	}
	if err := river.AddWorkerSafely(w, &ExpireSetupSessionsWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register expire_setup_sessions: %w", err)
	}
	// Runtime services (runtime_services.go, package jobs/services).
	if err := river.AddWorkerSafely(w, &RuntimeServiceWorker{deps: d}); err != nil {
		return nil, fmt.Errorf("jobs: register runtime_service: %w", err)
	}
	return w, nil
}

// ClientOptions chooses between a working client and an insert-only one.
type ClientOptions struct {
	// Work makes the client fetch and run jobs; false gives an insert-only client for web replicas.
	Work bool
	// MaxWorkers bounds concurrent jobs in the default queue on this node.
	MaxWorkers int
}

// fetchPollInterval is how often an idle client looks for jobs without being told: only a
// fallback, since every insert through Enqueue notifies its queue at commit (LISTEN/NOTIFY) and
// River's scheduler notifies for retried and scheduled jobs. 50 ms cost ~40 queries/s on an idle
// server (two queues), 5 s 24 queries a minute. River alone skips an insert's notification when
// the queue was notified within FetchCooldown, which left a job of a quick chain to this poll;
// Enqueue's own notification closes that (TestEnqueueNotifiesEveryInsert), so what still waits
// for it is a River-made insert (a periodic job, a retry) meeting another one within 1 ms
// (docs/jobs.md "Tuning").
const fetchPollInterval = 30 * time.Second

// tunedConfig is the client configuration every Berth process uses: a 1 ms fetch cooldown on top
// of LISTEN/NOTIFY for low pickup latency, and a fallback poll that costs an idle server little
// (docs/jobs.md).
func tunedConfig(d Deps, workers *river.Workers) *river.Config {
	return &river.Config{
		Logger:            riverLogger(d.Log),
		Workers:           workers,
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: fetchPollInterval,
		JobTimeout:        10 * time.Minute,
		MaxAttempts:       10,
		// The client id names the node (package jobs/executing); the middleware registers and
		// heartbeats the runs this process executes.
		ID:         d.Executing.ClientID(),
		Middleware: []rivertype.Middleware{&exhaustedMiddleware{deps: d}, &runMiddleware{deps: d}},
	}
}

// NewClient builds the River client, tuned for low pickup latency: a 1 ms fetch cooldown on top
// of LISTEN/NOTIFY, with a 30 s fallback poll (see docs/jobs.md for the measured effect).
func NewClient(d Deps, opts ClientOptions) (*river.Client[pgx.Tx], error) {
	if d.Executing == nil {
		d.Executing = executing.New(d.NodeID)
	}
	if d.Unmanaged == nil {
		d.Unmanaged = new(UnmanagedMemo)
	}
	workers, err := Workers(d)
	if err != nil {
		return nil, err
	}
	cfg := tunedConfig(d, workers)
	if opts.Work {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: max(opts.MaxWorkers, 1)}}
		if q := NodeQueue(d.NodeID); q != river.QueueDefault { // work bound to this node's disk (nodes_queue.go)
			cfg.Queues[q] = river.QueueConfig{MaxWorkers: max(opts.MaxWorkers, 1)}
		}
		cfg.PeriodicJobs = PeriodicJobs(d)
	}
	client, err := river.NewClient(riverpgxv5.New(d.Pool), cfg)
	if err != nil {
		return nil, fmt.Errorf("jobs: new client: %w", err)
	}
	return client, nil
}
