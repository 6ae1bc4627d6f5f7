package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"berth/db"
)

// bearer adds a token to every request of an MCP client.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// agent is an MCP client session of one token, with the progress notifications it received.
type agent struct {
	t  testing.TB
	cs *sdk.ClientSession

	mu       sync.Mutex
	progress []string
}

// mcpAgent connects the SDK's own client to the test server's /mcp with token.
func (e *testEnv) mcpAgent(token string) *agent {
	e.t.Helper()
	a := &agent{t: e.t}
	client := sdk.NewClient(&sdk.Implementation{Name: "berth-test-agent", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			a.mu.Lock()
			a.progress = append(a.progress, req.Params.Message)
			a.mu.Unlock()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.ts.URL + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}}, nil)
	if err != nil {
		e.t.Fatalf("mcp connect: %v", err)
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	a.cs = cs
	return a
}

// call calls a tool and returns the result, its JSON text decoded (nil if not an object), and
// the API error code when the tool refused.
func (a *agent) call(name string, args map[string]any) (res *sdk.CallToolResult, out map[string]any, code string) {
	a.t.Helper()
	return a.callWith(name, args, nil)
}

func (a *agent) callWith(name string, args map[string]any, progressToken any) (*sdk.CallToolResult, map[string]any, string) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := &sdk.CallToolParams{Name: name, Arguments: args}
	if progressToken != nil {
		p.SetProgressToken(progressToken)
	}
	res, err := a.cs.CallTool(ctx, p)
	if err != nil {
		a.t.Fatalf("%s: %v", name, err)
	}
	var out map[string]any
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*sdk.TextContent); ok {
			if json.Unmarshal([]byte(tc.Text), &out) != nil || out == nil {
				// file_read: the file as text, the rest as structured content
				out, _ = res.StructuredContent.(map[string]any)
				if out == nil {
					out = map[string]any{}
				}
				out["content"] = tc.Text
			}
		}
	}
	code := ""
	if res.IsError {
		e, _ := out["error"].(map[string]any)
		code, _ = e["code"].(string)
		if code == "" {
			code = "?"
		}
	}
	return res, out, code
}

// ok calls a tool that must succeed and returns its decoded JSON.
func (a *agent) ok(name string, args map[string]any) map[string]any {
	a.t.Helper()
	res, out, code := a.call(name, args)
	if res.IsError {
		a.t.Fatalf("%s(%v) refused: %s %v", name, args, code, out)
	}
	return out
}

// refused calls a tool that must be refused with the API's status and code.
func (a *agent) refused(name string, args map[string]any, status int, code string) {
	a.t.Helper()
	res, out, got := a.call(name, args)
	e, _ := out["error"].(map[string]any)
	if !res.IsError || got != code || e["status"] != float64(status) {
		a.t.Fatalf("%s(%v) = isError %v %v, want %d %s", name, args, res.IsError, out, status, code)
	}
}

func (a *agent) notes() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.progress...)
}

// foreignTask is a task of company B (its own project), for refusals.
func (re *runEnv) foreignTask() db.Task {
	re.t.Helper()
	ctx := context.Background()
	p, err := db.CreateProject(ctx, re.pool, re.r.B.ID, db.ProjectFields{Name: "B", Key: "BETA", Policy: db.ExecutionPolicy{
		DefaultMode: "isolated", Strategy: "git_worktree", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		re.t.Fatal(err)
	}
	task, err := db.CreateTask(ctx, re.pool, re.r.B.ID, p.ID, re.r.Other.User.ID, db.TaskFields{Title: "B", Command: "true",
		Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		re.t.Fatal(err)
	}
	return task
}

// runTokenIn inserts a running run of taskID in workspace wsID (made the task's own workspace)
// and mints its run token.
func (re *runEnv) runTokenIn(taskID, wsID string) (actor, string) {
	re.t.Helper()
	ctx := context.Background()
	if _, err := re.pool.Exec(ctx, `UPDATE execution_workspaces SET source_task_id = $2 WHERE id = $1`, wsID, taskID); err != nil {
		re.t.Fatal(err)
	}
	var id string
	if err := re.pool.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, execution_workspace_id, status, command, started_at)
		VALUES ($1, $2, $3, 'running', 'true', now()) RETURNING id`, re.r.A.ID, taskID, wsID).Scan(&id); err != nil {
		re.t.Fatal(err)
	}
	token, hash, err := db.NewToken()
	if err != nil {
		re.t.Fatal(err)
	}
	if err := db.CreateRunToken(ctx, re.pool, id, hash, time.Now().Add(time.Hour)); err != nil {
		re.t.Fatal(err)
	}
	return actor{Token: token}, id
}

// hasNote waits (up to 5 s: the client handles notifications on its own goroutine, so the last
// ones may land just after the call's result) for a progress notification.
func (a *agent) hasNote(want string) bool { return a.hasNoteWithin(want, 5*time.Second) }

// hasNoteWithin waits up to d for a progress notification.
func (a *agent) hasNoteWithin(want string, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if slices.Contains(a.notes(), want) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
