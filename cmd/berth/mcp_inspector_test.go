package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// inspectorBin is the MCP Inspector's launcher that scripts/test-deps.sh installs (with vite,
// in BERTH_TEST_NPM, default /var/tmp/berth-test-npm); missing, the test is skipped unless
// BERTH_REQUIRE_BROWSER=1 (set by `make test`) makes that a failure.
func inspectorBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BERTH_TEST_NPM")
	if dir == "" {
		dir = "/var/tmp/berth-test-npm"
	}
	bin := filepath.Join(dir, "node_modules", ".bin", "mcp-inspector")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatalf("the MCP Inspector is not installed in %s: run scripts/test-deps.sh", dir)
		}
		t.Skipf("the MCP Inspector is not installed in %s (scripts/test-deps.sh installs it)", dir)
	}
	return bin
}

// TestMCPInspectorAgainstDemo: a real MCP client no one here wrote (`npx
// @modelcontextprotocol/inspector --cli`) connects to `berth serve --demo` over streamable HTTP
// with an API token, lists the tools and calls plan_get and file_read on the demo task.
func TestMCPInspectorAgainstDemo(t *testing.T) {
	t.Parallel()
	bin := inspectorBin(t)
	base, vars := serveDemoWith(t)
	token, _, err := runCLI(t, vars, "", "token", "add", "--email", "admin@example.com", "--name", "inspector")
	if err != nil {
		t.Fatal(err)
	}
	token = strings.TrimSpace(token)
	taskID := demoTaskID(t, base, token)

	home := t.TempDir() // the Inspector keeps a catalog under $HOME
	run := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--cli", base + "/mcp", "--transport", "http",
			"--header", "Authorization: Bearer " + token}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home, "MCP_CATALOG_PATH="+filepath.Join(home, "mcp.json"), "NO_COLOR=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	inspect := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("inspector %v: %v\n%s", args, err, out)
		}
		return out
	}

	var tools struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	out := inspect("--method", "tools/list")
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &tools); err != nil {
		t.Fatalf("tools/list output is not JSON: %v\n%s", err, out)
	}
	names := map[string]bool{}
	for _, tl := range tools.Tools {
		names[tl.Name] = true
	}
	for _, want := range []string{"plan_get", "file_read", "file_edit", "run_start", "receipt_verify", "attempts_select"} {
		if !names[want] {
			t.Fatalf("the Inspector lists no %s: %v", want, names)
		}
	}
	if out := inspect("--method", "tools/call", "--tool-name", "plan_get", "--tool-arg", "task_id="+taskID); !strings.Contains(out, `\"trace\"`) || strings.Contains(out, `"isError": true`) {
		t.Fatalf("plan_get through the Inspector:\n%s", out)
	}
	out = inspect("--method", "tools/call", "--tool-name", "file_read", "--tool-arg", "task_id="+taskID, "--tool-arg", "path=README.md")
	if !strings.Contains(out, "A tiny project Berth created") || strings.Contains(out, `"isError": true`) {
		t.Fatalf("file_read through the Inspector:\n%s", out)
	}
	// Negative control: the same client is refused what the API refuses.
	if out, err := run("--method", "tools/call", "--tool-name", "file_read", "--tool-arg", "task_id="+taskID, "--tool-arg", "path=.git/config"); err == nil || !strings.Contains(out, "path_denied") {
		t.Fatalf("file_read of .git through the Inspector: %v\n%s", err, out)
	}
}

// demoTaskID finds the demo task through the API.
func demoTaskID(t *testing.T, base, token string) string {
	t.Helper()
	var list struct {
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	first := func(path string) string {
		t.Helper()
		list.Items = nil
		if err := json.Unmarshal(apiGet(t, base, token, path), &list); err != nil || len(list.Items) == 0 {
			t.Fatalf("GET %s: %v %v", path, err, list)
		}
		return list.Items[0].ID
	}
	company := first("/api/companies")
	project := first("/api/companies/" + company + "/projects")
	return first("/api/projects/" + project + "/tasks")
}
