package handlers

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment/seal"
	"berth/static"
	"berth/workspace"
	"berth/workspace/receipt"
)

// ownerNode runs another node's internal listener with its own workspace manager (its disk).
func (e *testEnv) ownerNode(id string, mgr *workspace.Manager) {
	e.t.Helper()
	assets, err := static.New()
	if err != nil {
		e.t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	sealer, err := seal.New(secret)
	if err != nil {
		e.t.Fatal(err)
	}
	base, _ := url.Parse(e.ts.URL)
	srv, err := New(Deps{Pool: e.pool, Assets: assets, Secrets: sealer, ReceiptKey: receipt.DeriveKey(secret), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		BaseURL: base, Version: "test", Nodes: &Nodes{Self: id, Key: nodeTestKey}, Workspaces: mgr})
	if err != nil {
		e.t.Fatal(err)
	}
	ts := httptest.NewServer(srv.InternalHandler())
	e.t.Cleanup(func() { ts.Close(); srv.Close() })
	if err := db.RegisterNode(context.Background(), e.pool, db.NodeRegistration{ID: id, Kind: db.NodeWorker,
		InternalURL: ts.URL, Works: true}); err != nil {
		e.t.Fatal(err)
	}
}

// TestFileResourcesForwardedToOwningNode: a task's execution workspace on another node's disk is
// one of its roots on the web node, and its files are listed, previewed, downloaded and refused
// through the owning node (the same deny list there), without a host path in any answer; another
// company's member still gets 404 on the web node; a silent owner is 503 node_unavailable; the
// HTML file browser shows the remote listing too.
func TestFileResourcesForwardedToOwningNode(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.Nodes = &Nodes{Self: "web", Key: nodeTestKey, DeadAfter: 30 * time.Second} })
	w := newFileWorldOn(t, e)
	ctx := context.Background()
	src := t.TempDir()
	fileWrite(t, filepath.Join(src, "hello.txt"), "from the other node\n")
	fileWrite(t, filepath.Join(src, "sub", "deep.txt"), "deep\n")
	fileWrite(t, filepath.Join(src, ".env"), "SECRET=on-the-other-node")
	mgr, err := workspace.NewManager(t.TempDir(), workspace.Options{})
	fileDo(t, err)
	res, err := mgr.RealizeCopy(ctx, src)
	fileDo(t, err)
	wsID := w.id(`INSERT INTO execution_workspaces (company_id, project_id, source_task_id, mode, strategy, status, ref, node_id)
		VALUES ($1, $2, $3, 'isolated', 'copy', 'ready', $4, 'w9') RETURNING id`, w.r.A.ID, w.Project, w.TaskID, res.Ref)
	root := executionWorkspaceRootPrefix + wsID
	e.ownerNode("w9", mgr)
	board := w.r.Board

	r := w.get(t, "", board, "roots", nil)
	if r.Status != http.StatusOK || !strings.Contains(r.Body, `"name":"`+root+`"`) {
		t.Fatalf("roots on the web node = %d %s; want the other node's workspace", r.Status, r.Body)
	}
	r = w.get(t, "", board, "list", url.Values{"root": {root}})
	names := fileNames(t, r.json(t))
	if r.Status != http.StatusOK || strings.Join(names, ",") != "hello.txt,sub" {
		t.Fatalf("remote list = %d %v", r.Status, names)
	}
	r = w.get(t, "", board, "content", url.Values{"root": {root}, "path": {"hello.txt"}})
	if out := r.json(t); r.Status != http.StatusOK || out["content"] != "from the other node\n" {
		t.Fatalf("remote content = %d %v", r.Status, out)
	}
	r = w.get(t, "", board, "content", url.Values{"root": {root}, "path": {"sub/deep.txt"}, "download": {"1"}})
	if r.Status != http.StatusOK || r.Body != "deep\n" || r.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("remote download = %d %q %v", r.Status, r.Body, r.Header)
	}
	for _, p := range []string{".env", "../../etc/passwd"} {
		r = w.get(t, "", board, "content", url.Values{"root": {root}, "path": {p}})
		if r.Status != http.StatusForbidden && r.Status != http.StatusBadRequest || strings.Contains(r.Body, "SECRET") {
			t.Fatalf("remote %s = %d %s; want the owner's refusal", p, r.Status, r.Body)
		}
	}
	if r := w.get(t, "", w.r.Other, "list", url.Values{"root": {root}}); r.Status != http.StatusNotFound {
		t.Fatalf("another company's member: %d", r.Status)
	}
	// The HTML file browser on the web node lists the remote root.
	resp, body := w.page(t, w.e.browser(board), "/tasks/"+w.TaskID+"/files?root="+url.QueryEscape(root), false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello.txt") {
		t.Fatalf("file browser page of the remote root = %d", resp.StatusCode)
	}

	if _, err := e.pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '1 minute' WHERE id = 'w9'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(nodeURLTTL + 100*time.Millisecond)
	if r := w.get(t, "", board, "list", url.Values{"root": {root}}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("owner down: %d %s", r.Status, r.Body)
	}
}
