package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type serviceInput struct {
	WorkspaceID  string `json:"workspace_id" jsonschema:"the execution workspace (inside a run: BERTH_WORKSPACE_ID)"`
	Name         string `json:"name" jsonschema:"the service's name, as its project workspace defines it"`
	Wait         bool   `json:"wait,omitempty" jsonschema:"service_start: wait until it is running and healthy, or failed, reporting each change as a progress notification"`
	WaitTimeoutS int    `json:"wait_timeout_s,omitempty" jsonschema:"how long to wait, at most 3600 seconds (default 600)"`
}

type serviceStatusInput struct {
	WorkspaceID string `json:"workspace_id" jsonschema:"the execution workspace"`
	Name        string `json:"name,omitempty" jsonschema:"one service by name (default: all of the workspace's)"`
}

type attemptsStartInput struct {
	TaskID       string `json:"task_id" jsonschema:"the task to run attempts of"`
	Count        int    `json:"count" jsonschema:"how many attempts, 2 to 8"`
	Command      string `json:"command,omitempty" jsonschema:"run this instead of the task's command"`
	TimeoutS     int    `json:"timeout_s,omitempty" jsonschema:"each run's timeout, 1 to 86400 seconds"`
	Wait         bool   `json:"wait,omitempty" jsonschema:"wait until every attempt is sealed, reporting each attempt's status change as a progress notification"`
	WaitTimeoutS int    `json:"wait_timeout_s,omitempty" jsonschema:"how long to wait, at most 3600 seconds (default 600)"`
}

type attemptsSelectInput struct {
	TaskID      string `json:"task_id" jsonschema:"the task"`
	WorkspaceID string `json:"workspace_id" jsonschema:"the chosen attempt's execution workspace"`
	Generation  int64  `json:"generation" jsonschema:"the group's generation, from attempts_compare"`
}

// serviceJSON is what a waiting call reads of a runtime service.
type serviceJSON struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Health string `json:"health"`
}

func servicesPath(ws string) string {
	return "/api/execution-workspaces/" + seg(ws) + "/runtime-services"
}

// service finds one service by name in the workspace's list: its raw JSON and its state.
func (s *Server) service(ctx context.Context, req *sdk.CallToolRequest, ws, name string) (json.RawMessage, serviceJSON, Reply) {
	r := s.call(ctx, req, Call{Method: http.MethodGet, Path: servicesPath(ws)})
	if !r.ok() {
		return nil, serviceJSON{}, r
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	_ = json.Unmarshal(r.Body, &list)
	for _, raw := range list.Items {
		var sv serviceJSON
		if json.Unmarshal(raw, &sv) == nil && sv.Name == name {
			return raw, sv, r
		}
	}
	return nil, serviceJSON{}, Reply{Status: http.StatusNotFound, Body: []byte(`{"error":{"code":"unknown_service","message":"The workspace has no service by that name."}}`)}
}

func (s *Server) addServiceTools() {
	tool(s, "service_start", "Start a runtime service (a preview) of the workspace (POST …/runtime-services/start). With wait, follow it until it is healthy or failed; the result carries its preview url.",
		func(ctx context.Context, req *sdk.CallToolRequest, in serviceInput) (*sdk.CallToolResult, any, error) {
			r := s.call(ctx, req, Call{Method: http.MethodPost, Path: servicesPath(in.WorkspaceID) + "/start", Body: map[string]any{"name": in.Name}})
			if !r.ok() || !in.Wait {
				return reply(r)
			}
			ctx, cancel := context.WithTimeout(ctx, waitBounds(in.WaitTimeoutS))
			defer cancel()
			p, last := newProgress(req), ""
			for {
				raw, sv, r := s.service(ctx, req, in.WorkspaceID, in.Name)
				if raw == nil {
					return toolError(r), nil, nil
				}
				if now := sv.Status + "/" + sv.Health; now != last {
					last = now
					p.send(ctx, fmt.Sprintf("service %s: %s, %s", sv.Name, sv.Status, sv.Health))
				}
				if sv.Status == "running" && sv.Health == "healthy" || sv.Status == "failed" {
					return textResult(raw), nil, nil
				}
				select {
				case <-ctx.Done():
					return jsonResult(map[string]any{"service": raw, "wait_timed_out": true}), nil, nil
				case <-time.After(s.poll):
				}
			}
		})
	tool(s, "service_stop", "Stop a runtime service (POST …/runtime-services/stop): its whole process group, then the port is free.",
		func(ctx context.Context, req *sdk.CallToolRequest, in serviceInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodPost, Path: servicesPath(in.WorkspaceID) + "/stop", Body: map[string]any{"name": in.Name}}))
		})
	tool(s, "service_status", "The workspace's runtime services (GET …/runtime-services): status, health, port and the preview url; one by name if given.",
		func(ctx context.Context, req *sdk.CallToolRequest, in serviceStatusInput) (*sdk.CallToolResult, any, error) {
			if in.Name == "" {
				return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: servicesPath(in.WorkspaceID)}))
			}
			raw, _, r := s.service(ctx, req, in.WorkspaceID, in.Name)
			if raw == nil {
				return toolError(r), nil, nil
			}
			return textResult(raw), nil, nil
		})
}

func (s *Server) addAttemptTools() {
	tool(s, "attempts_start", "Run count isolated attempts of the task from one base commit (POST /api/tasks/{id}/attempts, board members). With wait, follow them until all are sealed.",
		func(ctx context.Context, req *sdk.CallToolRequest, in attemptsStartInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{"count": in.Count}
			if in.Command != "" {
				body["command"] = in.Command
			}
			if in.TimeoutS != 0 {
				body["timeout_s"] = in.TimeoutS
			}
			path := "/api/tasks/" + seg(in.TaskID) + "/attempts"
			r := s.call(ctx, req, Call{Method: http.MethodPost, Path: path, Body: body})
			if !r.ok() || !in.Wait {
				return reply(r)
			}
			ctx, cancel := context.WithTimeout(ctx, waitBounds(in.WaitTimeoutS))
			defer cancel()
			p, seen := newProgress(req), map[int]string{}
			for {
				r := s.call(ctx, req, Call{Method: http.MethodGet, Path: path})
				if !r.ok() {
					return toolError(r), nil, nil
				}
				var g struct {
					Status string `json:"status"`
					Items  []struct {
						N      int    `json:"n"`
						Status string `json:"status"`
						Sealed bool   `json:"sealed"`
					} `json:"items"`
				}
				_ = json.Unmarshal(r.Body, &g)
				for _, it := range g.Items {
					now := it.Status
					if it.Sealed {
						now += ", sealed"
					}
					if seen[it.N] != now {
						seen[it.N] = now
						p.send(ctx, "attempt "+strconv.Itoa(it.N)+": "+now)
					}
				}
				if g.Status != "running" {
					return textResult(r.Body), nil, nil
				}
				select {
				case <-ctx.Done():
					return jsonResult(map[string]any{"attempts": json.RawMessage(r.Body), "wait_timed_out": true}), nil, nil
				case <-time.After(s.poll):
				}
			}
		})
	tool(s, "attempts_compare", "The task's attempt group (GET /api/tasks/{id}/attempts): each attempt's run, status, exit code, sealed final tree digest and branch, and the group's generation for attempts_select.",
		func(ctx context.Context, req *sdk.CallToolRequest, in taskInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/tasks/" + seg(in.TaskID) + "/attempts"}))
		})
	tool(s, "attempts_select", "Select one attempt (POST /api/tasks/{id}/attempts/select, board members): the decision is recorded at once (refs_state pending); a job then points the task branch at its head, moves the others to rescue refs and closes their workspaces (attempts_compare shows refs_state done).",
		func(ctx context.Context, req *sdk.CallToolRequest, in attemptsSelectInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{"workspace_id": in.WorkspaceID, "generation": in.Generation}
			return reply(s.call(ctx, req, Call{Method: http.MethodPost, Path: "/api/tasks/" + seg(in.TaskID) + "/attempts/select", Body: body}))
		})
}
