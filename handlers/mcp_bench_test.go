package handlers

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// mcpBench is a workspace with a 64 KiB text file, a board member's token, and an MCP session
// of that token, on a server whose file rate limit does not get in the way.
func mcpBench(b *testing.B) (*runEnv, *agent, string) {
	b.Helper()
	re := setupRuns(b, func(d *Deps) { d.FileRateBurst = 1 << 30 })
	ws, dir := re.serviceWorkspace("standard", nil)
	line := bytes.Repeat([]byte("0123456789abcdef"), 4) // 64 bytes with the newline
	line[63] = '\n'
	if err := os.WriteFile(filepath.Join(dir, "big.txt"), bytes.Repeat(line, 1024), 0o644); err != nil {
		b.Fatal(err)
	}
	task := re.task("true")
	if _, err := re.pool.Exec(b.Context(), `UPDATE execution_workspaces SET source_task_id = $2 WHERE id = $1`, ws.ID, task.ID); err != nil {
		b.Fatal(err)
	}
	return re, re.mcpAgent(re.r.Board.Token), task.ID
}

func p50ms(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// BenchmarkMCPFileRead: file_read of a 64 KiB file through MCP vs GET …/file-resources/content
// over HTTP with the same token, interleaved; p50 of each and their ratio (goal <= 1.5x). MCP is
// read twice: through the Go SDK's client (mcp-p50-ms), and through a client without an SDK
// (rawMCP: one POST, encoding/json, as REST's client decodes; raw-p50-ms), so the figure shows
// Berth's endpoint apart from the SDK client's own decoding.
func BenchmarkMCPFileRead(b *testing.B) {
	re, a, task := mcpBench(b)
	path := "/api/tasks/" + task + "/file-resources/content?path=big.txt"
	args := map[string]any{"task_id": task, "path": "big.txt"}
	raw := newRawMCP(b, re.ts.URL+"/mcp", re.r.Board.Token)
	var rest, mcp, plain []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		code, out := re.call(re.r.Board, http.MethodGet, path, nil)
		rest = append(rest, time.Since(start))
		if code != http.StatusOK || len(out["content"].(string)) != 64<<10 {
			b.Fatalf("REST read = %d", code)
		}
		start = time.Now()
		out = a.ok("file_read", args)
		mcp = append(mcp, time.Since(start))
		if len(out["content"].(string)) != 64<<10 {
			b.Fatal("MCP read is short")
		}
		start = time.Now()
		var meta struct {
			Path string `json:"path"`
		}
		text, structured, err := raw.tool("file_read", args)
		if err == nil {
			err = json.Unmarshal(structured, &meta)
		}
		if err != nil || len(text) != 64<<10 || meta.Path != "big.txt" {
			b.Fatalf("raw MCP read: %v (%d bytes, path %q)", err, len(text), meta.Path)
		}
		plain = append(plain, time.Since(start))
	}
	b.StopTimer()
	r, m, p := p50ms(rest), p50ms(mcp), p50ms(plain)
	b.ReportMetric(r, "rest-p50-ms")
	b.ReportMetric(m, "mcp-p50-ms")
	b.ReportMetric(m/r, "ratio-p50")
	b.ReportMetric(p, "raw-p50-ms")
	b.ReportMetric(p/r, "raw-ratio-p50")
}

// BenchmarkMCPToolCall: the overhead of a tool call over the API call it makes: task_get through
// MCP vs GET /api/tasks/{id}, interleaved; p50 of each and the difference (goal <= 2 ms).
func BenchmarkMCPToolCall(b *testing.B) {
	re, a, task := mcpBench(b)
	var rest, mcp []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if code, _ := re.call(re.r.Board, http.MethodGet, "/api/tasks/"+task, nil); code != http.StatusOK {
			b.Fatalf("REST task = %d", code)
		}
		rest = append(rest, time.Since(start))
		start = time.Now()
		a.ok("task_get", map[string]any{"task_id": task})
		mcp = append(mcp, time.Since(start))
	}
	b.StopTimer()
	r, m := p50ms(rest), p50ms(mcp)
	b.ReportMetric(r, "rest-p50-ms")
	b.ReportMetric(m, "mcp-p50-ms")
	b.ReportMetric(m-r, "overhead-p50-ms")
}
