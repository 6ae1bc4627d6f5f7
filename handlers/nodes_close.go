package handlers

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

// closeOnDeadNode closes, in tx, a workspace whose node has been declared dead and taken over
// (docs/scaling.md "A dead node's workspaces"): nothing can reach its directory from here, so
// the close ends at once as cleanup_failed with the reason, never silently dropped, and is
// audited. It reports whether it did; a workspace of a live (or this) node is left to the
// ordinary close. The takeover settled the node's runs and leases already.
func (s *Server) closeOnDeadNode(ctx context.Context, tx pgx.Tx, r *http.Request, a access, ws db.ExecutionWorkspace) (db.ExecutionWorkspace, bool, error) {
	if ws.NodeID == "" || ws.NodeID == s.nodes.self() {
		return ws, false, nil
	}
	taken, err := db.NodeTakenOver(ctx, tx, ws.NodeID)
	if err != nil || !taken {
		return ws, false, err
	}
	reason := fmt.Sprintf("Its node %s is dead, and its directory is on a machine Berth cannot reach from here. "+
		"Start that node again with the same BERTH_NODE_ID and close it again to have it removed, or remove it on that machine.", ws.NodeID)
	closing, err := db.BeginWorkspaceClose(ctx, tx, ws.ID, ws.Generation)
	if err != nil {
		return ws, false, err
	}
	failed, err := db.FailWorkspaceClose(ctx, tx, closing.ID, closing.Generation, reason)
	if err != nil {
		return ws, false, err
	}
	if err := s.auditTx(ctx, tx, r, a, "execution_workspace.close_node_dead", "execution_workspace", ws.ID,
		map[string]any{"generation": failed.Generation, "node": ws.NodeID}); err != nil {
		return ws, false, err
	}
	return failed, true, nil
}
