package mcp

import (
	"context"
	"net/http"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// taskInput names a task.
type taskInput struct {
	TaskID string `json:"task_id" jsonschema:"the task's id (inside a run: BERTH_TASK_ID)"`
}

// workspaceInput names an execution workspace.
type workspaceInput struct {
	WorkspaceID string `json:"workspace_id" jsonschema:"the execution workspace's id (inside a run: BERTH_WORKSPACE_ID)"`
}

// runInput names a run.
type runInput struct {
	RunID string `json:"run_id" jsonschema:"the run's id (inside a run: BERTH_RUN_ID)"`
}

type receiptVerifyInput struct {
	RunID   string         `json:"run_id" jsonschema:"the run whose receipt to verify"`
	Receipt map[string]any `json:"receipt,omitempty" jsonschema:"a receipt document to check instead of the stored one (it must be this run's)"`
}

type workProductInput struct {
	TaskID               string         `json:"task_id" jsonschema:"the task the product belongs to"`
	Kind                 string         `json:"kind" jsonschema:"branch, commit, preview_url, artifact or file"`
	Ref                  string         `json:"ref,omitempty" jsonschema:"branch name or commit (branch and commit need it)"`
	URL                  string         `json:"url,omitempty" jsonschema:"absolute http(s) URL (preview_url needs it)"`
	Path                 string         `json:"path,omitempty" jsonschema:"path relative to the workspace (artifact and file)"`
	Metadata             map[string]any `json:"metadata,omitempty" jsonschema:"free-form JSON object, at most 16 KiB"`
	ExecutionWorkspaceID string         `json:"execution_workspace_id,omitempty" jsonschema:"the workspace it came from (a run token: its own, by default)"`
}

func (s *Server) addTaskTools() {
	tool(s, "plan_get", "The task's effective plan (GET /api/tasks/{id}/plan): mode, strategy, environment, blockers and the trace of every rule that fired.",
		func(ctx context.Context, req *sdk.CallToolRequest, in taskInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/tasks/" + seg(in.TaskID) + "/plan"}))
		})
	tool(s, "task_get", "The task (GET /api/tasks/{id}): key, title, description, status, command, trust, workspace mode.",
		func(ctx context.Context, req *sdk.CallToolRequest, in taskInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/tasks/" + seg(in.TaskID)}))
		})
	tool(s, "workspace_readiness", "Whether an execution workspace may be closed (GET /api/execution-workspaces/{id}/close-readiness): state, blocking reasons, warnings, git state, running services, planned actions.",
		func(ctx context.Context, req *sdk.CallToolRequest, in workspaceInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/execution-workspaces/" + seg(in.WorkspaceID) + "/close-readiness"}))
		})
	tool(s, "work_product_add", "Record a work product for review (POST /api/tasks/{id}/work-products): a branch, commit, preview URL, artifact or file.",
		func(ctx context.Context, req *sdk.CallToolRequest, in workProductInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{"kind": in.Kind, "ref": in.Ref, "url": in.URL, "path": in.Path, "metadata": in.Metadata,
				"execution_workspace_id": in.ExecutionWorkspaceID}
			return reply(s.call(ctx, req, Call{Method: http.MethodPost, Path: "/api/tasks/" + seg(in.TaskID) + "/work-products", Body: body}))
		})
	tool(s, "receipt_get", "A run's signed receipt (GET /api/runs/{id}/receipt): digests of base and result, command, exit code, disposition, signature.",
		func(ctx context.Context, req *sdk.CallToolRequest, in runInput) (*sdk.CallToolResult, any, error) {
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: "/api/runs/" + seg(in.RunID) + "/receipt"}))
		})
	tool(s, "receipt_verify", "Verify a run's receipt (POST /api/runs/{id}/receipt/verify): the signature, then each digest against the workspace, artifact and branch that still exist.",
		func(ctx context.Context, req *sdk.CallToolRequest, in receiptVerifyInput) (*sdk.CallToolResult, any, error) {
			c := Call{Method: http.MethodPost, Path: "/api/runs/" + seg(in.RunID) + "/receipt/verify"}
			if len(in.Receipt) > 0 {
				c.Body = map[string]any{"receipt": in.Receipt}
			}
			return reply(s.call(ctx, req, c))
		})
}
