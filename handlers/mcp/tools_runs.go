package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type runStartInput struct {
	TaskID         string `json:"task_id" jsonschema:"the task to run"`
	Command        string `json:"command,omitempty" jsonschema:"run this instead of the task's command (only where the project allows task overrides, never for low trust)"`
	TimeoutS       int    `json:"timeout_s,omitempty" jsonschema:"the run's own timeout, 1 to 86400 seconds (default 3600)"`
	IdempotencyKey string `json:"idempotency_key,omitempty" jsonschema:"the same key returns the same run for 24 hours"`
	Wait           bool   `json:"wait,omitempty" jsonschema:"wait until the run has ended and its finalize settled, reporting status and log lines as progress notifications"`
	WaitTimeoutS   int    `json:"wait_timeout_s,omitempty" jsonschema:"how long to wait, at most 3600 seconds (default 600); the run goes on after it"`
}

type runLogInput struct {
	RunID  string `json:"run_id" jsonschema:"the run whose log to read"`
	Offset int64  `json:"offset,omitempty" jsonschema:"return what follows the first offset bytes (next_offset of the previous call)"`
	Tail   int64  `json:"tail,omitempty" jsonschema:"return the last tail bytes instead"`
}

// runState is what a waiting call reads of GET /api/runs/{id}.
type runState struct {
	Status   string `json:"status"`
	Finalize struct {
		State string `json:"state"`
	} `json:"finalize"`
}

// ended reports a terminal run whose finalize is no longer pending.
func (r runState) ended() bool {
	switch r.Status {
	case "succeeded", "failed", "cancelled", "timed_out":
		return r.Finalize.State != "pending"
	}
	return false
}

func (s *Server) addRunTools() {
	tool(s, "run_start", "Start a run of the task (POST /api/tasks/{id}/runs, board members). With wait, follow it to the end: status changes and log lines come as progress notifications, the result is the run and its log tail.",
		func(ctx context.Context, req *sdk.CallToolRequest, in runStartInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{}
			if in.Command != "" {
				body["command"] = in.Command
			}
			if in.TimeoutS != 0 {
				body["timeout_s"] = in.TimeoutS
			}
			c := Call{Method: http.MethodPost, Path: "/api/tasks/" + seg(in.TaskID) + "/runs", Body: body}
			if in.IdempotencyKey != "" {
				c.Header = map[string]string{"Idempotency-Key": in.IdempotencyKey}
			}
			r := s.call(ctx, req, c)
			if !r.ok() || !in.Wait {
				return reply(r)
			}
			var run struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(r.Body, &run); err != nil {
				return reply(r)
			}
			return s.followRun(ctx, req, run.ID, waitBounds(in.WaitTimeoutS))
		})
	tool(s, "run_log", "A run's log (GET /api/runs/{id}/log): what follows offset, or the last tail bytes; next_offset continues from there.",
		func(ctx context.Context, req *sdk.CallToolRequest, in runLogInput) (*sdk.CallToolResult, any, error) {
			q := query("offset", num(in.Offset), "tail", num(in.Tail))
			r := s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/runs/" + seg(in.RunID) + "/log", Query: q})
			if !r.ok() {
				return toolError(r), nil, nil
			}
			next, _ := strconv.ParseInt(r.Header.Get("X-Log-Offset"), 10, 64)
			return jsonResult(map[string]any{"run_id": in.RunID, "text": strings.ToValidUTF8(string(r.Body), "\uFFFD"),
				"next_offset": next, "log_truncated": r.Header.Get("X-Log-Truncated") == "true"}), nil, nil
		})
	tool(s, "run_cancel", "Ask a live run to stop (POST /api/runs/{id}/cancel, board members); its finalize still runs.",
		func(ctx context.Context, req *sdk.CallToolRequest, in runInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodPost, Path: "/api/runs/" + seg(in.RunID) + "/cancel"}))
		})
}

// followRun polls a run until it has ended (or the wait is over), sending each status change
// and each complete log line as a progress notification; the result is the run, the last 4 KiB
// of its log and whether the wait ran out first.
func (s *Server) followRun(ctx context.Context, req *sdk.CallToolRequest, id string, wait time.Duration) (*sdk.CallToolResult, any, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p := newProgress(req)
	var (
		offset  int64
		carry   []byte
		last    string
		runBody []byte
	)
	// readLog sends the complete lines printed since the last read (the log before the status:
	// a line read implies the status read after it is at least running).
	readLog := func() {
		if p.token == nil {
			return
		}
		l := s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/runs/" + seg(id) + "/log", Query: query("offset", num(offset))})
		if !l.ok() {
			return
		}
		if next, err := strconv.ParseInt(l.Header.Get("X-Log-Offset"), 10, 64); err == nil {
			offset = next
		}
		carry = append(carry, l.Body...)
		for {
			i := bytes.IndexByte(carry, '\n')
			if i < 0 {
				break
			}
			p.send(ctx, strings.ToValidUTF8(string(carry[:i]), "\uFFFD"))
			carry = carry[i+1:]
		}
	}
	for {
		readLog()
		r := s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/runs/" + seg(id)})
		if !r.ok() {
			return toolError(r), nil, nil
		}
		runBody = r.Body
		var st runState
		_ = json.Unmarshal(r.Body, &st)
		if st.Status != last {
			last = st.Status
			p.send(ctx, "status: "+st.Status)
		}
		if st.ended() {
			readLog() // what it printed last
			if len(carry) > 0 {
				p.send(ctx, strings.ToValidUTF8(string(carry), "\uFFFD"))
			}
			break
		}
		select {
		case <-ctx.Done():
			return s.runResult(context.WithoutCancel(ctx), req, id, runBody, true)
		case <-time.After(s.poll):
		}
	}
	return s.runResult(ctx, req, id, runBody, false)
}

// runResult is a followed run's answer: the run object, its log tail, and timed_out.
func (s *Server) runResult(ctx context.Context, req *sdk.CallToolRequest, id string, run []byte, timedOut bool) (*sdk.CallToolResult, any, error) {
	tail := s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/runs/" + seg(id) + "/log", Query: query("tail", "4096")})
	out := map[string]any{"run": json.RawMessage(bytes.TrimSpace(run)), "wait_timed_out": timedOut}
	if tail.ok() {
		out["log_tail"] = strings.ToValidUTF8(string(tail.Body), "\uFFFD")
	}
	return jsonResult(out), nil, nil
}
