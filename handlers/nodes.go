package handlers

import (
	"net/http"
	"sync"
	"time"

	"berth/db"
	"berth/views"
)

// Nodes is what this node's web server knows of the node registry (DESIGN §11,
// docs/scaling.md): its own id, the node-to-node key (NodeKey) and when a silent node counts as
// dead. Nil on Deps means a single node: nothing is forwarded and the internal listener has
// nothing to serve.
type Nodes struct {
	Self      string
	Key       []byte
	DeadAfter time.Duration

	dirOnce sync.Once
	dir     *nodeDirectory // other nodes' internal URLs (preview_forward.go)
}

// deadAfter is the configured dead-after interval, DESIGN §11's 30 s by default.
func (n *Nodes) deadAfter() time.Duration {
	if n == nil || n.DeadAfter <= 0 {
		return 30 * time.Second
	}
	return n.DeadAfter
}

// self is this node's id ("" when the server does not know it).
func (n *Nodes) self() string {
	if n == nil {
		return ""
	}
	return n.Self
}

// nodeJSON is a node in GET /api/nodes.
type nodeJSON struct {
	ID          string        `json:"id"`
	Kind        string        `json:"kind"`
	InternalURL string        `json:"internal_url"`
	StartedAt   time.Time     `json:"started_at"`
	HeartbeatAt time.Time     `json:"heartbeat_at"`
	Alive       bool          `json:"alive"`
	Version     string        `json:"version"`
	Works       bool          `json:"works"`
	Capacity    int           `json:"capacity"`
	TakenOverAt *time.Time    `json:"taken_over_at"`
	Holds       nodeHoldsJSON `json:"holds"`
}

// nodeHoldsJSON counts what a node holds.
type nodeHoldsJSON struct {
	Runs          int `json:"runs"`
	Leases        int `json:"leases"`
	Services      int `json:"services"`
	SetupSessions int `json:"setup_sessions"`
}

func newNodeJSON(n db.Node) nodeJSON {
	return nodeJSON{ID: n.ID, Kind: n.Kind, InternalURL: n.InternalURL, StartedAt: n.StartedAt, HeartbeatAt: n.HeartbeatAt,
		Alive: n.Alive, Version: n.Version, Works: n.Works, Capacity: n.Capacity, TakenOverAt: n.TakenOverAt,
		Holds: nodeHoldsJSON{Runs: n.Holds.Runs, Leases: n.Holds.Leases, Services: n.Holds.Services, SetupSessions: n.Holds.SetupSessions}}
}

// isInstanceAdmin: a signed-in instance administrator (session or their API token; never a
// run token).
func isInstanceAdmin(p *principal) bool {
	return p != nil && p.Run == nil && p.User.IsInstanceAdmin
}

// nodesAPI is GET /api/nodes (instance admins; anyone else the same 404 as a missing route):
// every node, alive first, with what it holds. The list is short (one row per process
// identity), so it is one page.
func (s *Server) nodesAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	nodes, err := db.ListNodes(r.Context(), s.pool, s.nodes.deadAfter())
	if err != nil {
		return err
	}
	items := make([]nodeJSON, 0, len(nodes))
	for _, n := range nodes {
		items = append(items, newNodeJSON(n))
	}
	writeJSON(w, http.StatusOK, listResponse[nodeJSON]{Items: items})
	return nil
}

// nodesPage is GET /admin/nodes (instance admins; anyone else 404).
func (s *Server) nodesPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	nodes, err := db.ListNodes(r.Context(), s.pool, s.nodes.deadAfter())
	if err != nil {
		return err
	}
	rows := make([]views.NodeRow, 0, len(nodes))
	for _, n := range nodes {
		rows = append(rows, views.NodeRow{ID: n.ID, Kind: n.Kind, InternalURL: n.InternalURL, Version: n.Version, Works: n.Works, Capacity: n.Capacity,
			Alive: n.Alive, TakenOver: n.TakenOverAt != nil, StartedAt: n.StartedAt, HeartbeatAt: n.HeartbeatAt,
			Runs: n.Holds.Runs, Leases: n.Holds.Leases, Services: n.Holds.Services, SetupSessions: n.Holds.SetupSessions})
	}
	return s.render(w, r, views.NodesPage(s.frame(r, "Nodes", "admin-nodes"), rows, s.nodes.deadAfter().String()))
}
