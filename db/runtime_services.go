package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Runtime service statuses, health and desired states (migration 0007).
const (
	ServiceStarting = "starting"
	ServiceRunning  = "running"
	ServiceStopping = "stopping"
	ServiceStopped  = "stopped"
	ServiceFailed   = "failed"

	HealthUnknown   = "unknown"
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"

	DesiredRunning = "running"
	DesiredStopped = "stopped"
)

// ErrServiceState means a service row moved on (another generation, another status) since the
// caller read it; nothing was written.
var ErrServiceState = errors.New("runtime service state changed")

// RuntimeService is one preview or dev server of an execution workspace.
type RuntimeService struct {
	ID                   string
	CompanyID            string
	ExecutionWorkspaceID string
	ProjectWorkspaceID   string
	RunID                string
	Name                 string
	Command              string
	Cwd                  string
	Port                 int // 0 = never reserved
	Status               string
	Health               string
	DesiredState         string
	StopPolicy           string
	Lifecycle            string
	IdleTimeoutS         int
	PID, PGID            int
	ProcessStart         uint64
	NodeID               string
	SupervisorID         string
	LogPath              string
	// ProviderRef is the plugin instance the service runs on ("" for this node's supervisor).
	ProviderRef   string
	Generation    int64
	Restarts      int
	ExitCode      *int
	LogExcerpt    string
	StopReason    string
	StartedAt     *time.Time
	StoppedAt     *time.Time
	LastRequestAt *time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// StartRequestedAt is when the last start or restart was accepted (nil: never).
	StartRequestedAt *time.Time
}

// Reported is the status callers see: the row's own status, except that a start accepted after
// the service last ended reads starting while the row still says stopped or failed (the start
// job has not picked it up yet). The job side works on Status.
func (s RuntimeService) Reported() string {
	if s.DesiredState != DesiredRunning || (s.Status != ServiceStopped && s.Status != ServiceFailed) || s.StartRequestedAt == nil {
		return s.Status
	}
	if s.StoppedAt == nil || s.StartRequestedAt.After(*s.StoppedAt) {
		return ServiceStarting
	}
	return s.Status
}

// Live reports whether the service may have processes: starting, running or stopping.
func (s RuntimeService) Live() bool {
	return s.Status == ServiceStarting || s.Status == ServiceRunning || s.Status == ServiceStopping
}

const runtimeServiceColumns = `id, company_id, execution_workspace_id, coalesce(project_workspace_id::text, ''),
	coalesce(run_id::text, ''), name, command, cwd, coalesce(port, 0), status, health, desired_state, stop_policy,
	lifecycle, idle_timeout_s, coalesce(pid, 0), coalesce(pgid, 0), coalesce(process_start, 0), node_id,
	supervisor_id, log_path, provider_ref, generation, restarts, exit_code, log_excerpt, stop_reason, started_at, stopped_at,
	last_request_at, created_at, updated_at, start_requested_at`

func scanRuntimeService(row pgx.Row) (RuntimeService, error) {
	var s RuntimeService
	var start int64
	err := row.Scan(&s.ID, &s.CompanyID, &s.ExecutionWorkspaceID, &s.ProjectWorkspaceID, &s.RunID, &s.Name, &s.Command,
		&s.Cwd, &s.Port, &s.Status, &s.Health, &s.DesiredState, &s.StopPolicy, &s.Lifecycle, &s.IdleTimeoutS, &s.PID,
		&s.PGID, &start, &s.NodeID, &s.SupervisorID, &s.LogPath, &s.ProviderRef, &s.Generation, &s.Restarts, &s.ExitCode,
		&s.LogExcerpt, &s.StopReason, &s.StartedAt, &s.StoppedAt, &s.LastRequestAt, &s.CreatedAt, &s.UpdatedAt, &s.StartRequestedAt)
	s.ProcessStart = uint64(start)
	return s, notFound(err)
}

func collectRuntimeServices(rows pgx.Rows) ([]RuntimeService, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (RuntimeService, error) { return scanRuntimeService(r) })
}

// EnsureRuntimeService returns the row of the workspace's service def.Name, creating it stopped
// when it does not exist yet, and refreshes what the definition says (read at each start).
func EnsureRuntimeService(ctx context.Context, q Querier, companyID, workspaceID, projectWorkspaceID string, def ServiceDefinition) (RuntimeService, error) {
	row := q.QueryRow(ctx, `INSERT INTO runtime_services (company_id, execution_workspace_id, project_workspace_id, name,
			command, stop_policy, lifecycle)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (execution_workspace_id, name) DO UPDATE
		SET command = EXCLUDED.command, stop_policy = EXCLUDED.stop_policy, lifecycle = EXCLUDED.lifecycle,
			project_workspace_id = EXCLUDED.project_workspace_id, updated_at = now()
		WHERE runtime_services.company_id = EXCLUDED.company_id
		RETURNING `+runtimeServiceColumns,
		companyID, workspaceID, nullable(projectWorkspaceID), def.Name, def.Command, def.StopPolicy, def.Lifecycle)
	s, err := scanRuntimeService(row)
	if err != nil {
		return s, fmt.Errorf("ensure runtime service: %w", err)
	}
	return s, nil
}

// RuntimeServiceByID reads a service of the company.
func RuntimeServiceByID(ctx context.Context, q Querier, companyID, id string) (RuntimeService, error) {
	if !validUUID(id) {
		return RuntimeService{}, ErrNotFound
	}
	return scanRuntimeService(q.QueryRow(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services
		WHERE company_id = $1 AND id = $2`, companyID, id))
}

// RuntimeServiceForProxy reads a service by id alone, for the preview proxy, which then checks
// the caller's membership of the service's company.
func RuntimeServiceForProxy(ctx context.Context, q Querier, id string) (RuntimeService, error) {
	if !validUUID(id) {
		return RuntimeService{}, ErrNotFound
	}
	return scanRuntimeService(q.QueryRow(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services WHERE id = $1`, id))
}

// LockRuntimeService reads a service FOR UPDATE, serializing its start and stop steps.
func LockRuntimeService(ctx context.Context, tx pgx.Tx, id string) (RuntimeService, error) {
	if !validUUID(id) {
		return RuntimeService{}, ErrNotFound
	}
	return scanRuntimeService(tx.QueryRow(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services WHERE id = $1 FOR UPDATE`, id))
}

// WorkspaceRuntimeServices lists a workspace's service rows by name.
func WorkspaceRuntimeServices(ctx context.Context, q Querier, companyID, workspaceID string) ([]RuntimeService, error) {
	rows, err := q.Query(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services
		WHERE company_id = $1 AND execution_workspace_id = $2 ORDER BY name`, companyID, workspaceID)
	if err != nil {
		return nil, fmt.Errorf("workspace runtime services: %w", err)
	}
	return collectRuntimeServices(rows)
}

// SetRuntimeServiceDesired records what a caller asked for (running or stopped), and the run that
// asked ("" keeps the current one).
func SetRuntimeServiceDesired(ctx context.Context, q Querier, id, desired, runID string) (RuntimeService, error) {
	return scanRuntimeService(q.QueryRow(ctx, `UPDATE runtime_services
		SET desired_state = $2, run_id = coalesce($3::uuid, run_id), restarts = CASE WHEN $2 = 'running' THEN 0 ELSE restarts END,
			start_requested_at = CASE WHEN $2 = 'running' THEN clock_timestamp() ELSE start_requested_at END, updated_at = now()
		WHERE id = $1 RETURNING `+runtimeServiceColumns, id, desired, nullable(runID)))
}

// ServiceStart is what a start records before the process exists.
type ServiceStart struct {
	Port         int
	NodeID       string
	SupervisorID string
	LogPath      string
	Command      string
	IdleTimeoutS int
}

// MarkRuntimeServiceStarting moves a service to starting under a new generation with its port
// (unique per node among live services: a port another service holds is a unique violation,
// ErrPortTaken).
func MarkRuntimeServiceStarting(ctx context.Context, q Querier, id string, st ServiceStart) (RuntimeService, error) {
	if st.IdleTimeoutS <= 0 {
		st.IdleTimeoutS = 1800
	}
	s, err := scanRuntimeService(q.QueryRow(ctx, `UPDATE runtime_services
		SET status = 'starting', health = 'unknown', port = nullif($2, 0), provider_ref = '', node_id = $3, supervisor_id = $4, log_path = $5,
			command = $6, idle_timeout_s = $7, generation = generation + 1, pid = NULL, pgid = NULL,
			process_start = NULL, exit_code = NULL, log_excerpt = '', stop_reason = '', started_at = now(),
			stopped_at = NULL, last_request_at = NULL, updated_at = now()
		WHERE id = $1 RETURNING `+runtimeServiceColumns, id, st.Port, st.NodeID, st.SupervisorID, st.LogPath, st.Command,
		st.IdleTimeoutS))
	if isUniqueViolation(err) {
		return s, ErrPortTaken
	}
	return s, err
}

// ErrPortTaken means another live service of the node holds the port.
var ErrPortTaken = errors.New("port taken by another service")

// MarkRuntimeServiceRunning records the healthy process of generation gen.
func MarkRuntimeServiceRunning(ctx context.Context, q Querier, id string, gen int64, pid, pgid int, start uint64) (RuntimeService, error) {
	s, err := scanRuntimeService(q.QueryRow(ctx, `UPDATE runtime_services
		SET status = 'running', health = 'healthy', pid = $3, pgid = $4, process_start = $5, updated_at = now()
		WHERE id = $1 AND generation = $2 AND status = 'starting' RETURNING `+runtimeServiceColumns,
		id, gen, pid, pgid, int64(start)))
	if errors.Is(err, ErrNotFound) {
		return s, ErrServiceState
	}
	return s, err
}

// MarkRuntimeServiceRemote records where a starting plugin service runs: its instance, and the
// port on this host's loopback the plugin published it on (ErrPortTaken when another live service
// of the node holds that number; ErrServiceState when generation gen moved on).
func MarkRuntimeServiceRemote(ctx context.Context, q Querier, id string, gen int64, port int, providerRef string) (RuntimeService, error) {
	s, err := scanRuntimeService(q.QueryRow(ctx, `UPDATE runtime_services
		SET port = $3, provider_ref = $4, updated_at = now()
		WHERE id = $1 AND generation = $2 AND status = 'starting' RETURNING `+runtimeServiceColumns, id, gen, port, providerRef))
	switch {
	case isUniqueViolation(err):
		return s, ErrPortTaken
	case errors.Is(err, ErrNotFound):
		return s, ErrServiceState
	}
	return s, err
}

// MarkRuntimeServiceStopping moves a live service to stopping.
func MarkRuntimeServiceStopping(ctx context.Context, q Querier, id string) error {
	_, err := q.Exec(ctx, `UPDATE runtime_services SET status = 'stopping', updated_at = now()
		WHERE id = $1 AND status IN ('starting', 'running')`, id)
	return err
}

// ServiceEnd is how a service's process ended.
type ServiceEnd struct {
	Status     string // stopped or failed
	ExitCode   *int
	LogExcerpt string
	StopReason string
	Restarts   int // the crash restarts counted so far (reset by a start request)
}

// MarkRuntimeServiceEnded settles a service as stopped or failed, its port released. With gen > 0
// only that generation is settled (ErrServiceState otherwise).
func MarkRuntimeServiceEnded(ctx context.Context, q Querier, id string, gen int64, e ServiceEnd) (RuntimeService, error) {
	s, err := scanRuntimeService(q.QueryRow(ctx, `UPDATE runtime_services
		SET status = $3, health = 'unknown', exit_code = $4, log_excerpt = $5, stop_reason = $6, restarts = $7,
			pid = NULL, pgid = NULL, process_start = NULL, stopped_at = now(), updated_at = now()
		WHERE id = $1 AND ($2 = 0 OR generation = $2) RETURNING `+runtimeServiceColumns,
		id, gen, e.Status, e.ExitCode, e.LogExcerpt, e.StopReason, e.Restarts))
	if errors.Is(err, ErrNotFound) {
		return s, ErrServiceState
	}
	return s, err
}

// NodeServicePorts are the ports the node's live services hold.
func NodeServicePorts(ctx context.Context, q Querier, nodeID string) (map[int]bool, error) {
	rows, err := q.Query(ctx, `SELECT port FROM runtime_services
		WHERE node_id = $1 AND port IS NOT NULL AND status IN ('starting', 'running', 'stopping')`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("node service ports: %w", err)
	}
	ports, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("node service ports: %w", err)
	}
	out := make(map[int]bool, len(ports))
	for _, p := range ports {
		out[p] = true
	}
	return out, nil
}

// NodeRuntimeServices lists the node's services that are live or should run.
func NodeRuntimeServices(ctx context.Context, q Querier, nodeID string) ([]RuntimeService, error) {
	rows, err := q.Query(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services
		WHERE node_id = $1 AND (status IN ('starting', 'running', 'stopping') OR desired_state = 'running')
		ORDER BY id`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("node runtime services: %w", err)
	}
	return collectRuntimeServices(rows)
}

// TouchRuntimeService records a proxied request (for the idle_timeout stop policy).
func TouchRuntimeService(ctx context.Context, q Querier, id string) error {
	_, err := q.Exec(ctx, `UPDATE runtime_services SET last_request_at = now() WHERE id = $1`, id)
	return err
}

// IdleRuntimeServices are the node's running idle_timeout services without a proxied request
// for their idle timeout (counted from the start when none came).
func IdleRuntimeServices(ctx context.Context, q Querier, nodeID string) ([]RuntimeService, error) {
	rows, err := q.Query(ctx, `SELECT `+runtimeServiceColumns+` FROM runtime_services
		WHERE node_id = $1 AND status = 'running' AND desired_state = 'running' AND stop_policy = 'idle_timeout'
		  AND coalesce(last_request_at, started_at) < now() - idle_timeout_s * interval '1 second'`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("idle runtime services: %w", err)
	}
	return collectRuntimeServices(rows)
}
