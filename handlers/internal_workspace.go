package handlers

// A workspace on another node's disk (docs/scaling.md): the close-readiness of a worker's
// workspace needs its git state, which only the node holding it can read. A web node asks that
// node's internal listener, signed like every node-to-node request.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"berth/db"
	"berth/workspace"
)

// remoteGit is what a workspace's node reads of it for its close-readiness.
type remoteGit struct {
	Managed          bool                `json:"managed"`
	Git              *workspace.GitState `json:"git"`
	CommitsSinceBase *int                `json:"commits_since_base"`
}

// readWorkspaceGit reads ws's git facts from this node's disk.
func (s *Server) readWorkspaceGit(ctx context.Context, ws db.ExecutionWorkspace) (remoteGit, error) {
	var out remoteGit
	if s.workspaces == nil {
		return out, nil
	}
	root, err := s.workspaces.Root(ws.Ref)
	out.Managed = err == nil && root != ""
	if !out.Managed || ws.Strategy != string(workspace.StrategyGitWorktree) {
		return out, nil
	}
	gs, err := s.workspaces.GitState(ctx, ws.Ref, ws.BaseRef)
	if err != nil {
		return out, err
	}
	out.Git = &gs
	if gs.Readable && ws.BaseCommit != "" {
		if n, err := s.workspaces.CommitsSince(ctx, ws.Ref, ws.BaseCommit); err == nil {
			out.CommitsSinceBase = &n
		}
	}
	return out, nil
}

// internalWorkspaceGit is GET /internal/workspaces/{id}/git?company=…: ws's git facts, for a web
// node evaluating its close. 404 unless this node holds it.
func (s *Server) internalWorkspaceGit(w http.ResponseWriter, r *http.Request) {
	ws, err := db.ExecutionWorkspaceByID(r.Context(), s.pool, r.URL.Query().Get("company"), r.PathValue("id"))
	if err != nil || ws.NodeID != s.nodes.self() {
		s.renderError(w, r, errNotFound)
		return
	}
	out, err := s.readWorkspaceGit(r.Context(), ws)
	if err != nil {
		s.renderError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// remoteWorkspaceGit asks ws's node for its git facts when another node holds it; nil (read
// here) when this node does, or no node does.
func (s *Server) remoteWorkspaceGit(ctx context.Context, ws db.ExecutionWorkspace) (*remoteGit, error) {
	if s.nodes == nil || len(s.nodes.Key) == 0 || ws.NodeID == "" || ws.NodeID == s.nodes.Self {
		return nil, nil
	}
	target := s.nodeURLCtx(ctx, ws.NodeID)
	if target == nil {
		return nil, errNodeDown
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := strings.TrimSuffix(target.String(), "/") + "/internal/workspaces/" + ws.ID + "/git?company=" + ws.CompanyID
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if err := signNodeRequest(req, s.nodes.Key, time.Now()); err != nil {
		return nil, fmt.Errorf("%w: %v", errNodeSign, err)
	}
	resp, err := s.nodeDir().transport.RoundTrip(req)
	if err != nil {
		s.log.WarnContext(ctx, "workspace git from its node", "node", ws.NodeID, "err", err)
		return nil, errNodeDown
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("workspace %s git from node %s: status %d", ws.ID, ws.NodeID, resp.StatusCode)
	}
	var out remoteGit
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("workspace %s git from node %s: %w", ws.ID, ws.NodeID, err)
	}
	return &out, nil
}
