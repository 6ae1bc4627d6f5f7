package handlers

// File resources on another node (DESIGN §11, docs/scaling.md): an execution workspace lives on
// the disk of the node that realized it. A web node lists it among a task's roots all the same,
// and reads it through the owning node's internal listener, signed with the node-to-node key
// (internal.go) and naming the user it authenticated, the way previews are forwarded. The owning
// node runs the same handlers (the same resolver, deny list, caps, audit and rate limit) for that
// user; nothing of the root's host path leaves it. Run tokens read files on their own node only
// (a run reaches Berth through the node it runs on).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"berth/db"
	"berth/workspace"
)

// errRootElsewhere refuses a run token a root on another node.
var errRootElsewhere = &httpError{Status: http.StatusConflict, Code: "root_on_other_node",
	Message: "This workspace lives on another node; a run token reads files on its own node only."}

// remoteRoot reports the node other than this one whose disk holds ws ("" for none).
func (s *Server) remoteRoot(ws db.ExecutionWorkspace) string {
	if s.nodes == nil || len(s.nodes.Key) == 0 || ws.NodeID == "" || ws.NodeID == s.nodes.Self {
		return ""
	}
	return ws.NodeID
}

// remoteFiles asks root's node for op ("list" or "content") of the task's files with the query
// in and decodes its answer into out; a refusal there comes back as the same httpError here.
func (s *Server) remoteFiles(ctx context.Context, a access, taskID string, root fileRoot, op string, in fileQuery, out any) error {
	if a.P.Run != nil {
		return errRootElsewhere
	}
	target := s.nodeURLCtx(ctx, root.node)
	if target == nil {
		return errNodeDown
	}
	v := url.Values{"root": {root.Name}, "path": {in.Path}}
	if in.Cursor != "" {
		v.Set("cursor", in.Cursor)
	}
	if in.Limit > 0 {
		v.Set("limit", fmt.Sprint(in.Limit))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := strings.TrimSuffix(target.String(), "/") + "/internal/tasks/" + taskID + "/file-resources/" + op + "?" + v.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set(nodeUserHeader, a.P.User.ID)
	req.Header.Set("Accept", "application/json")
	if err := signNodeRequest(req, s.nodes.Key, time.Now()); err != nil {
		return fmt.Errorf("%w: %v", errNodeSign, err)
	}
	resp, err := s.nodeDir().transport.RoundTrip(req)
	if err != nil {
		s.log.WarnContext(ctx, "file resources from their node", "node", root.node, "err", err)
		s.nodeDir().forget(root.node)
		return errNodeDown
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 4<<20) // a preview is at most 512 KiB, base64 included
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.NewDecoder(body).Decode(&e) == nil && e.Error.Code != "" && resp.StatusCode >= 400 && resp.StatusCode < 500 {
			return &httpError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
		}
		return fmt.Errorf("file resources of task %s from node %s: status %d", taskID, root.node, resp.StatusCode)
	}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		return fmt.Errorf("file resources of task %s from node %s: %w", taskID, root.node, err)
	}
	return nil
}

// remoteList is listFiles for a root on another node.
func (s *Server) remoteList(ctx context.Context, a access, taskID string, root fileRoot, in fileQuery) (workspace.Page, error) {
	var page workspace.Page
	return page, s.remoteFiles(ctx, a, taskID, root, "list", in, &page)
}

// remoteRead is readFile for a root on another node.
func (s *Server) remoteRead(ctx context.Context, a access, taskID string, root fileRoot, in fileQuery) (workspace.Content, error) {
	var c workspace.Content
	return c, s.remoteFiles(ctx, a, taskID, root, "content", in, &c)
}

// remoteDownload streams a file of a root on another node through that node.
func (s *Server) remoteDownload(w http.ResponseWriter, r *http.Request, a access, taskID string, root fileRoot) error {
	if a.P.Run != nil {
		return errRootElsewhere
	}
	node := s.remoteNode(r, root.node)
	if node == "" {
		return errNoReadableWorkspace // never forwarded twice
	}
	return s.forwardTo(w, r, node, "/internal/tasks/"+taskID+"/file-resources/content", a.P.User.ID)
}

// internalFiles serves a file-resource read another node forwarded: as the user it names (still a
// member: objectAccess checks it again), through the same handler as the API, on the node whose
// disk holds the workspace.
func (s *Server) internalFiles(h func(http.ResponseWriter, *http.Request, *principal) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		userID := r.Header.Get(nodeUserHeader)
		r.Header.Del(nodeUserHeader)
		r.Header.Set("Accept", "application/json")
		u, err := db.UserByID(ctx, s.pool, userID)
		if err != nil || u.Disabled {
			s.renderError(w, r, errNotFound)
			return
		}
		p := &principal{User: u, Via: "node"}
		r2 := r.Clone(context.WithValue(ctx, principalKey, p))
		if err := h(w, r2, p); err != nil {
			s.renderError(w, r2, err)
		}
	}
}
