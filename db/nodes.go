package db

// The node registry (DESIGN §11, docs/scaling.md): one row per Berth process identity
// (BERTH_NODE_ID), renewed by its heartbeat. A node silent for longer than the dead-after interval
// is dead; the first live node to lock its row takes over what it held, once per life of the
// node (a restart registers again and starts a new life).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Node kinds.
const (
	NodeServe  = "serve"
	NodeWorker = "worker"
)

// ErrNodeTakenOver is returned to a node's heartbeat when the others declared it dead and took
// over what it held: it must register again (a new life) before it claims anything.
var ErrNodeTakenOver = errors.New("node taken over")

// Node is one node's row, with whether it is alive by the reader's dead-after interval and what
// it holds right now.
type Node struct {
	ID          string
	Kind        string
	InternalURL string
	Version     string
	Works       bool
	Capacity    int
	StartedAt   time.Time
	HeartbeatAt time.Time
	TakenOverAt *time.Time
	Alive       bool
	Holds       NodeHoldings
}

// NodeHoldings counts what a node holds: live runs, live leases of its runs, live runtime
// services and open setup sessions.
type NodeHoldings struct {
	Runs          int
	Leases        int
	Services      int
	SetupSessions int
}

// NodeRegistration is what a starting node says of itself.
type NodeRegistration struct {
	ID          string
	Kind        string
	InternalURL string
	Version     string
	Works       bool
	// Capacity is how many runs the node executes at once (its --max-workers); 0 when it does
	// not work jobs.
	Capacity int
}

// RegisterNode records a node's new life: its row is created or replaced, started and heartbeat
// now (database clock), no takeover. It waits for a takeover of its previous life in progress
// (the row lock), so a node never starts while others are settling what it held.
func RegisterNode(ctx context.Context, q Querier, r NodeRegistration) error {
	if _, err := q.Exec(ctx, `INSERT INTO nodes (id, kind, internal_url, version, works, capacity)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, internal_url = EXCLUDED.internal_url,
			version = EXCLUDED.version, works = EXCLUDED.works, capacity = EXCLUDED.capacity,
			started_at = now(), heartbeat_at = now(), taken_over_at = NULL`,
		r.ID, r.Kind, r.InternalURL, r.Version, r.Works, max(r.Capacity, 0)); err != nil {
		return fmt.Errorf("register node %s: %w", r.ID, err)
	}
	return nil
}

// Heartbeat is what a node heartbeat answers besides renewing the row.
type Heartbeat struct {
	// OthersDead: some other node has been silent for deadAfter without being taken over.
	OthersDead bool
	// Recovery: which periodic recovery job has work now or within the heartbeat's ahead.
	Recovery RecoveryDue
}

// HeartbeatNode renews a node's heartbeat in one statement that also looks for dead nodes (so a
// cluster of live nodes pays nothing more for that) and answers RecoveryDue, counting what
// expires within ahead as due (the answer holds that long; RecoveryMemo). ErrNodeTakenOver: the
// others took over this life of the node (it was silent too long); ErrNotFound: its row is gone.
func HeartbeatNode(ctx context.Context, q Querier, id string, deadAfter, ahead time.Duration) (Heartbeat, error) {
	var hb Heartbeat
	var taken *bool
	err := q.QueryRow(ctx, `WITH beat AS (
			UPDATE nodes SET heartbeat_at = CASE WHEN taken_over_at IS NULL THEN now() ELSE heartbeat_at END
			WHERE id = $1 RETURNING taken_over_at IS NOT NULL AS taken)
		SELECT (SELECT taken FROM beat), EXISTS (SELECT 1 FROM nodes d WHERE d.id <> $1
			AND d.taken_over_at IS NULL AND d.heartbeat_at < now() - $2::interval), `+recoveryDueColumns("$3", "$4"),
		id, deadAfter, ahead, LiveRunStatuses).Scan(&taken, &hb.OthersDead, &hb.Recovery.Leases, &hb.Recovery.SetupSessions, &hb.Recovery.Live)
	switch {
	case err != nil:
		return Heartbeat{}, fmt.Errorf("node heartbeat: %w", err)
	case taken == nil:
		return Heartbeat{}, fmt.Errorf("node heartbeat: %w", ErrNotFound)
	case *taken:
		return hb, ErrNodeTakenOver
	}
	return hb, nil
}

// LighterNode is the live working node to hand a new run to instead of node self, or "" to keep
// it: the one with the smallest share of its capacity in use (its queued, preparing and running
// runs), when even with this run added that share is below self's now. So a node hands over only
// while another has more room, and two nodes never hand one run back and forth. Nodes of
// unknown capacity (0) neither hand over nor take.
func LighterNode(ctx context.Context, q Querier, self string, deadAfter time.Duration) (string, error) {
	var id string
	err := q.QueryRow(ctx, `WITH load AS (
			SELECT n.id, n.capacity::float8 AS capacity,
				(SELECT count(*) FROM runs r WHERE r.node_id = n.id
					AND r.status IN ('queued', 'preparing', 'running'))::float8 AS live -- runs_live_node_idx
			FROM nodes n
			WHERE n.works AND n.capacity > 0 AND n.taken_over_at IS NULL AND n.heartbeat_at >= now() - $2::interval)
		SELECT o.id FROM load me JOIN load o ON o.id <> me.id
		WHERE me.id = $1 AND (o.live + 1) / o.capacity < me.live / me.capacity
		ORDER BY o.live / o.capacity, o.id LIMIT 1`, self, deadAfter).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("lighter node: %w", err)
	}
	return id, nil
}

// nodeColumns reads a node with its holdings; $1 is the dead-after interval.
const nodeColumns = `n.id, n.kind, n.internal_url, n.version, n.works, n.capacity, n.started_at, n.heartbeat_at, n.taken_over_at,
	n.taken_over_at IS NULL AND n.heartbeat_at >= now() - $1::interval,
	(SELECT count(*) FROM runs r WHERE r.node_id = n.id AND r.status IN ('queued', 'preparing', 'running')),
	(SELECT count(*) FROM environment_leases l JOIN runs r ON r.id = l.run_id
		WHERE r.node_id = n.id AND l.status IN ('acquiring', 'active', 'releasing')),
	(SELECT count(*) FROM runtime_services s WHERE s.node_id = n.id AND s.status IN ('starting', 'running', 'stopping')),
	(SELECT count(*) FROM image_setup_sessions x WHERE x.node_id = n.id
		AND x.status IN ('starting', 'waiting_for_user', 'capturing'))`

func scanNode(row pgx.Row) (Node, error) {
	var n Node
	err := row.Scan(&n.ID, &n.Kind, &n.InternalURL, &n.Version, &n.Works, &n.Capacity, &n.StartedAt, &n.HeartbeatAt, &n.TakenOverAt,
		&n.Alive, &n.Holds.Runs, &n.Holds.Leases, &n.Holds.Services, &n.Holds.SetupSessions)
	return n, notFound(err)
}

// ListNodes lists every node, alive ones first, then by id.
func ListNodes(ctx context.Context, q Querier, deadAfter time.Duration) ([]Node, error) {
	rows, err := q.Query(ctx, `SELECT `+nodeColumns+` FROM nodes n
		ORDER BY (n.taken_over_at IS NULL AND n.heartbeat_at >= now() - $1::interval) DESC, n.id`, deadAfter)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Node, error) { return scanNode(row) })
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return nodes, nil
}

// NodeByID reads one node.
func NodeByID(ctx context.Context, q Querier, id string, deadAfter time.Duration) (Node, error) {
	return scanNode(q.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes n WHERE n.id = $2`, deadAfter, id))
}

// NodeAlive reports whether node id has a row and is alive by deadAfter.
func NodeAlive(ctx context.Context, q Querier, id string, deadAfter time.Duration) (bool, error) {
	var alive bool
	err := q.QueryRow(ctx, `SELECT taken_over_at IS NULL AND heartbeat_at >= now() - $2::interval FROM nodes WHERE id = $1`,
		id, deadAfter).Scan(&alive)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("node %s alive: %w", id, err)
	}
	return alive, nil
}

// DeadNodes lists the nodes silent for longer than deadAfter whose current life nobody took
// over yet.
func DeadNodes(ctx context.Context, q Querier, deadAfter time.Duration) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT id FROM nodes WHERE taken_over_at IS NULL AND heartbeat_at < now() - $1::interval
		ORDER BY heartbeat_at`, deadAfter)
	if err != nil {
		return nil, fmt.Errorf("dead nodes: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("dead nodes: %w", err)
	}
	return ids, nil
}

// LockDeadNode locks node id's row for the rest of tx if it is still dead by deadAfter and not
// taken over, and reports whether it did; another node taking it over at the same time makes it
// false (SKIP LOCKED), as does a heartbeat or a restart that came first.
func LockDeadNode(ctx context.Context, tx pgx.Tx, id string, deadAfter time.Duration) (bool, error) {
	var got string
	err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE id = $1 AND taken_over_at IS NULL
		AND heartbeat_at < now() - $2::interval FOR UPDATE SKIP LOCKED`, id, deadAfter).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock dead node %s: %w", id, err)
	}
	return true, nil
}

// MarkNodeTakenOver records, in the takeover's transaction, that this life of node id was
// taken over.
func MarkNodeTakenOver(ctx context.Context, tx pgx.Tx, id string) error {
	if _, err := tx.Exec(ctx, `UPDATE nodes SET taken_over_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("mark node %s taken over: %w", id, err)
	}
	return nil
}

// ExpireNodeLeases expires at once (not at their TTL) the live leases of node's runs and of its
// workspaces, through the same state change as ordinary expiry (generation + 1, cleanup pending),
// and returns them for their cleanup jobs and audit events.
func ExpireNodeLeases(ctx context.Context, tx pgx.Tx, node string) ([]Lease, error) {
	rows, err := tx.Query(ctx, `WITH due AS (
			SELECT l.id FROM environment_leases l
			WHERE l.status IN ('acquiring', 'active', 'releasing')
			  AND (l.run_id IN (SELECT id FROM runs WHERE node_id = $1)
			    OR l.execution_workspace_id IN (SELECT id FROM execution_workspaces WHERE node_id = $1))
			FOR UPDATE)
		UPDATE environment_leases AS l
		SET status = 'expired', generation = l.generation + 1, released_at = now(), expires_at = now(),
			cleanup_status = 'pending', failure_reason = 'expired: its node ' || $1 || ' is dead'
		FROM due WHERE l.id = due.id
		RETURNING `+leaseColumns, node)
	if err != nil {
		return nil, fmt.Errorf("expire leases of node %s: %w", node, err)
	}
	leases, err := collectLeases(rows)
	if err != nil {
		return nil, fmt.Errorf("expire leases of node %s: %w", node, err)
	}
	return leases, nil
}

// StopNodeServices marks node's live runtime services stopped (their processes died with the
// node, or its startup sweep kills them) and returns how many; desired_state is kept, so the
// node restarts the ones that should run when it comes back.
func StopNodeServices(ctx context.Context, tx pgx.Tx, node string) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE runtime_services SET status = 'stopped', health = 'unknown', stopped_at = now(),
			stop_reason = 'node_dead', updated_at = now()
		WHERE node_id = $1 AND status IN ('starting', 'running', 'stopping')`, node)
	if err != nil {
		return 0, fmt.Errorf("stop services of node %s: %w", node, err)
	}
	return tag.RowsAffected(), nil
}

// FailNodeSetupSessions ends node's open image setup sessions as failed: their shell and scratch
// layer were on the dead node.
func FailNodeSetupSessions(ctx context.Context, tx pgx.Tx, node string) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE image_setup_sessions SET status = 'failed',
			error = 'its node ' || $1 || ' died', finished_at = now(), updated_at = now()
		WHERE node_id = $1 AND status IN ('starting', 'waiting_for_user', 'capturing')`, node)
	if err != nil {
		return 0, fmt.Errorf("fail setup sessions of node %s: %w", node, err)
	}
	return tag.RowsAffected(), nil
}
