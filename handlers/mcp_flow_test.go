package handlers

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"berth/db"
)

// TestMCPAgentFlow is an agent's session end to end with the SDK's own client: it starts a run
// and follows its log through progress notifications, starts a preview of the run's workspace,
// runs 3 attempts of another task, selects one and verifies its receipt; the run's log and
// receipt are resources by URI too.
func TestMCPAgentFlow(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	ctx := context.Background()
	web := db.ServiceDefinition{Name: "web", Command: `exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 20, StopPolicy: "manual", Lifecycle: "ephemeral"}
	pw, err := db.CreateProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "git", Source: re.repo, DefaultRef: "main", Services: []db.ServiceDefinition{web}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, pw.ID); err != nil {
		t.Fatal(err)
	}
	// The command prints, then waits for the test to have seen that line as a notification while
	// the run is still live, then finishes: the log is followed, not read afterwards.
	task := re.task(`echo "mcp=$BERTH_MCP_URL"; echo line-one; while [ ! -e go ]; do sleep 0.05; done; echo line-two; echo done`)
	agent := re.mcpAgent(re.r.Board.Token)
	type result struct {
		out  map[string]any
		code string
	}
	done := make(chan result, 1)
	go func() { // no t.Fatal off the test's goroutine: a transport error comes back as the code
		p := &sdk.CallToolParams{Name: "run_start", Arguments: map[string]any{"task_id": task.ID, "wait": true, "wait_timeout_s": 120, "timeout_s": 120}}
		p.SetProgressToken("run-1")
		res, err := agent.cs.CallTool(ctx, p)
		if err != nil {
			done <- result{nil, "transport: " + err.Error()}
			return
		}
		var out map[string]any
		_ = json.Unmarshal([]byte(res.Content[0].(*sdk.TextContent).Text), &out)
		code := ""
		if res.IsError {
			code = "refused"
		}
		done <- result{out, code}
	}()
	if !agent.hasNoteWithin("line-one", 90*time.Second) {
		t.Fatalf("no log line while the run is live: %q", agent.notes())
	}
	if !agent.hasNote("status: running") || slices.Contains(agent.notes(), "status: succeeded") {
		t.Fatalf("notifications while live = %q", agent.notes())
	}
	var ref string
	if err := re.pool.QueryRow(ctx, `SELECT w.ref FROM runs r JOIN execution_workspaces w ON w.id = r.execution_workspace_id
		WHERE r.task_id = $1`, task.ID).Scan(&ref); err != nil {
		t.Fatal(err)
	}
	root, err := re.srv.workspaces.Root(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.code != "" {
		t.Fatalf("run_start = %s %v", res.code, res.out)
	}
	out := res.out
	run := out["run"].(map[string]any)
	if run["status"] != "succeeded" || out["wait_timed_out"] != false || !strings.Contains(out["log_tail"].(string), "done") {
		t.Fatalf("run_start wait = %v", out)
	}
	for _, want := range []string{"line-two", "done", "status: succeeded"} {
		if !agent.hasNote(want) {
			t.Fatalf("progress notifications %q lack %q", agent.notes(), want)
		}
	}
	notes := agent.notes()
	if i := slices.IndexFunc(notes, func(n string) bool { return strings.HasPrefix(n, "mcp=") }); i < 0 || !strings.HasSuffix(notes[i], "/mcp") {
		t.Fatalf("the run did not get BERTH_MCP_URL: %q", notes)
	}
	runID, wsID := run["id"].(string), run["execution_workspace_id"].(string)
	if out := agent.ok("run_log", map[string]any{"run_id": runID, "tail": 5}); out["text"] != "done\n" {
		t.Fatalf("run_log tail = %v", out)
	}

	// Its log and receipt as resources.
	rr, err := agent.cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "berth://runs/" + runID + "/log"})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, "line-two") {
		t.Fatalf("log resource = %v %v", rr, err)
	}
	rr, err = agent.cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "berth://runs/" + runID + "/receipt"})
	if err != nil || !strings.Contains(rr.Contents[0].Text, `"signature"`) || rr.Contents[0].MIMEType != "application/json" {
		t.Fatalf("receipt resource = %v %v", rr, err)
	}
	stranger := re.mcpAgent(re.r.Other.Token)
	if _, err := stranger.cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "berth://runs/" + runID + "/log"}); err == nil {
		t.Fatal("another company read the run's log resource")
	}

	// A preview of the run's workspace, with its URL.
	sv := agent.ok("service_start", map[string]any{"workspace_id": wsID, "name": "web", "wait": true, "wait_timeout_s": 60})
	if sv["status"] != "running" || sv["health"] != "healthy" || sv["url"] == "" {
		t.Fatalf("service_start = %v", sv)
	}
	if st := agent.ok("service_status", map[string]any{"workspace_id": wsID, "name": "web"}); st["url"] != sv["url"] {
		t.Fatalf("service_status = %v", st)
	}
	agent.ok("service_stop", map[string]any{"workspace_id": wsID, "name": "web"})

	// Three attempts of another task, followed until sealed; one is selected.
	other := re.task("true")
	_, g, code := agent.callWith("attempts_start", map[string]any{"task_id": other.ID, "count": 3, "wait": true, "wait_timeout_s": 180,
		"command": `echo "$BERTH_RUN_ID" > "out-$BERTH_RUN_ID.txt"`}, "attempts-1")
	if code != "" || g["status"] != "sealed" || len(g["items"].([]any)) != 3 {
		t.Fatalf("attempts_start = %s %v", code, g)
	}
	if !agent.hasNote("attempt 3: succeeded, sealed") {
		t.Fatalf("attempt notifications = %q", agent.notes())
	}
	cmp := agent.ok("attempts_compare", map[string]any{"task_id": other.ID})
	chosen := cmp["items"].([]any)[1].(map[string]any)
	sel := agent.ok("attempts_select", map[string]any{"task_id": other.ID, "workspace_id": chosen["execution_workspace_id"],
		"generation": cmp["generation"]})
	if sel["status"] != "selected" {
		t.Fatalf("attempts_select = %v", sel)
	}
	agent.refused("attempts_select", map[string]any{"task_id": other.ID, "workspace_id": chosen["execution_workspace_id"],
		"generation": cmp["generation"]}, 409, sel409(t, re, other.ID, chosen, cmp))

	// The chosen attempt's receipt, fetched and verified.
	rc := agent.ok("receipt_get", map[string]any{"run_id": chosen["run_id"]})
	if rc["signature"] == nil || rc["run_id"] != chosen["run_id"] {
		t.Fatalf("receipt_get = %v", rc)
	}
	v := agent.ok("receipt_verify", map[string]any{"run_id": chosen["run_id"]})
	if v["signature"] != "ok" || v["verified"] != true || v["mismatched"] != float64(0) || v["matched"].(float64) < 1 {
		t.Fatalf("receipt_verify = %v", v)
	}
	// A changed receipt fails its signature (negative control).
	rc["exit_code"] = 7
	if v := agent.ok("receipt_verify", map[string]any{"run_id": chosen["run_id"], "receipt": rc}); v["signature"] != "failed" || v["verified"] != false {
		t.Fatalf("forged receipt_verify = %v", v)
	}
}

// sel409 is the code a second selection of the same group gets over the REST API: the MCP tool
// must answer the same.
func sel409(t *testing.T, re *runEnv, taskID string, chosen, cmp map[string]any) string {
	t.Helper()
	code, out := re.call(re.r.Board, "POST", "/api/tasks/"+taskID+"/attempts/select",
		map[string]any{"workspace_id": chosen["execution_workspace_id"], "generation": cmp["generation"]})
	if code != 409 {
		t.Fatalf("second selection over REST = %d %v", code, out)
	}
	return taskErrorCode(out)
}
