package handlers

import (
	"net/http"
	"strings"
	"testing"
)

// TestLocalSourcesStayInsideSourceRoots: a board member cannot point a project workspace at the
// host's files outside the configured roots (nor reach them through a symlink inside a root);
// an instance administrator who is a board member can.
func TestLocalSourcesStayInsideSourceRoots(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	code, proj := e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/projects", map[string]any{"name": "P", "key": "SRC"})
	if code != http.StatusCreated {
		t.Fatalf("create project = %d %v", code, proj)
	}
	path := "/api/projects/" + proj["id"].(string) + "/workspaces"
	inside := t.TempDir()
	for name, source := range map[string]string{"outside": "/usr/share", "file URL": "file:///usr/share"} {
		body := map[string]any{"name": "w", "source_type": "directory", "source": source}
		if strings.HasPrefix(source, "file://") {
			body["source_type"], body["default_ref"] = "git", "main"
		}
		code, out := e.call(r.Board, http.MethodPost, path, body)
		errObj, _ := out["error"].(map[string]any)
		fields, _ := errObj["fields"].(map[string]any)
		if code != http.StatusUnprocessableEntity || fields["source"] == nil {
			t.Errorf("%s: board member = %d %v, want 422 on source", name, code, out)
		}
	}
	if n := e.count(`SELECT count(*) FROM project_workspaces`); n != 0 {
		t.Fatalf("refused sources created %d workspaces", n)
	}
	if code, out := e.call(r.Board, http.MethodPost, path, map[string]any{"name": "ok", "source_type": "directory", "source": inside}); code != http.StatusCreated {
		t.Fatalf("inside the roots = %d %v", code, out)
	}
	// An instance admin who is also a board member owns the host: any path.
	e.member(r.A.ID, r.Admin.User.ID, "board")
	if code, out := e.call(r.Admin, http.MethodPost, path, map[string]any{"name": "host", "source_type": "directory", "source": "/usr/share"}); code != http.StatusCreated {
		t.Fatalf("admin board member outside the roots = %d %v", code, out)
	}
}
