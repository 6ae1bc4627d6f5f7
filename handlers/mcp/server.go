// Package mcp is Berth's Model Context Protocol server (DESIGN §17, docs/mcp.md): POST /mcp and
// GET /mcp (the stream) on the official Go SDK's streamable HTTP transport.
//
// It holds no rules of its own. Every tool and resource is one or more calls of Berth's JSON
// API, made in-process through Options.Backend with the caller's own identity (a run token: its
// task, run and workspace; an API token: what its user may), so authorization, company scoping,
// validation, error codes and audit events are the API's, by construction. A refusal comes back
// as a tool result with isError set and the API's error object (code, message, status) as its
// content; a resource the caller may not read is a JSON-RPC error. Long calls (run_start,
// service_start, attempts_start with wait) poll the API and report run status and log lines as
// MCP progress notifications when the client gave a progress token.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Call is one request of Berth's JSON API, made on behalf of the MCP caller.
type Call struct {
	Method string
	Path   string // absolute, with every caller-supplied segment escaped (see seg)
	Query  url.Values
	Body   any // sent as JSON when not nil
	Header map[string]string
}

// Reply is the API's answer to a Call.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	// Value is the Go value the route encoded as Body, when it answered with one JSON value
	// (nil otherwise): a tool may read it instead of decoding Body.
	Value any
}

// Backend serves a Call through the API's route table as the principal that who identifies
// (who is the token info that the /mcp endpoint's bearer check put on the MCP request).
type Backend func(ctx context.Context, who *auth.TokenInfo, c Call) Reply

// Options configures the server.
type Options struct {
	Backend Backend
	Version string
	Logger  *slog.Logger
	// PollInterval is how often a waiting call looks at its run or service (default 200 ms).
	PollInterval time.Duration
	// SessionTimeout closes a session idle this long (default 30 minutes).
	SessionTimeout time.Duration
}

// Server is the MCP server and its HTTP handler.
type Server struct {
	sdk     *sdk.Server
	handler *sdk.StreamableHTTPHandler
	backend Backend
	poll    time.Duration
}

// New builds the server with every tool and resource registered.
func New(o Options) *Server {
	if o.PollInterval <= 0 {
		o.PollInterval = 200 * time.Millisecond
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = 30 * time.Minute
	}
	s := &Server{backend: o.Backend, poll: o.PollInterval}
	s.sdk = sdk.NewServer(&sdk.Implementation{Name: "berth", Title: "Berth", Version: o.Version}, &sdk.ServerOptions{
		Instructions: instructions, Logger: o.Logger})
	s.sdk.AddReceivingMiddleware(flatResults)
	s.addTaskTools()
	s.addFileTools()
	s.addRunTools()
	s.addServiceTools()
	s.addAttemptTools()
	s.addResources()
	s.handler = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.sdk }, &sdk.StreamableHTTPOptions{
		Logger: o.Logger, SessionTimeout: o.SessionTimeout,
		// Berth checks the Host header itself for every route (BERTH_BASE_URL), also behind a
		// proxy on loopback, where the SDK's own check would refuse the public name.
		DisableLocalhostProtection: true,
	})
	return s
}

// Handler serves POST, GET and DELETE /mcp. The request must carry the caller's token info
// (auth.RequireBearerToken), which binds the session to that caller.
func (s *Server) Handler() http.Handler { return s.handler }

// Close ends every session, and with it every open GET stream (for http.Server's shutdown).
func (s *Server) Close() {
	for ss := range s.sdk.Sessions() {
		_ = ss.Close()
	}
}

const instructions = `Berth runs tasks in execution workspaces. With a run token (BERTH_RUN_TOKEN, inside a run)
you reach your own task, run and workspace: BERTH_TASK_ID, BERTH_RUN_ID and BERTH_WORKSPACE_ID name them.
Start with plan_get and files_list; file_edit replaces text only when it occurs exactly as often as expected.`

// seg escapes one caller-supplied path segment, so an id can never add segments to a path.
func seg(v string) string { return url.PathEscape(v) }

// who is the caller of a request (nil outside an authenticated /mcp request).
func who(extra *sdk.RequestExtra) *auth.TokenInfo {
	if extra == nil {
		return nil
	}
	return extra.TokenInfo
}

// call makes one API call for the caller of req.
func (s *Server) call(ctx context.Context, req *sdk.CallToolRequest, c Call) Reply {
	return s.backend(ctx, who(req.Extra), c)
}

// ok reports a success status.
func (r Reply) ok() bool { return r.Status >= 200 && r.Status < 300 }

// apiError is the error object of a refused call, with its HTTP status.
func (r Reply) apiError() map[string]any {
	var body struct {
		Error map[string]any `json:"error"`
	}
	if json.Unmarshal(r.Body, &body) != nil || body.Error == nil {
		body.Error = map[string]any{"code": "http_" + http.StatusText(r.Status), "message": strings.TrimSpace(string(r.Body))}
	}
	body.Error["status"] = r.Status
	return map[string]any{"error": body.Error}
}

// toolError is a refusal as a tool result: isError, the API's error object as text and as
// structured content.
func toolError(r Reply) *sdk.CallToolResult {
	e := r.apiError()
	b, _ := json.Marshal(e)
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, StructuredContent: e}
}

// textResult is a successful answer: the API's JSON body as the tool's text content.
func textResult(body []byte) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(bytes.TrimRight(body, "\n"))}}}
}

// jsonResult marshals v as the tool's text content.
func jsonResult(v any) *sdk.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"error":{"code":"internal","message":"the result could not be encoded"}}`)
	}
	return textResult(b)
}

// reply turns an API answer into the tool's result.
func reply(r Reply) (*sdk.CallToolResult, any, error) {
	if !r.ok() {
		return toolError(r), nil, nil
	}
	return textResult(r.Body), nil, nil
}

// progress sends progress notifications for one tool call, when its client asked for them.
type progress struct {
	req   *sdk.CallToolRequest
	token any
	n     float64
}

func newProgress(req *sdk.CallToolRequest) *progress {
	return &progress{req: req, token: req.Params.GetProgressToken()}
}

// send reports one step (a status change, a log line); without a progress token it does nothing.
func (p *progress) send(ctx context.Context, msg string) {
	if p.token == nil || p.req.Session == nil {
		return
	}
	if len(msg) > maxProgressMessage {
		msg = msg[:maxProgressMessage] + "…"
	}
	p.n++
	_ = p.req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: p.token, Message: msg, Progress: p.n})
}

// maxProgressMessage bounds one notification's message (a long log line is cut).
const maxProgressMessage = 4096

// waitBounds turns a wait_timeout_s into a duration: default 600 s, at most 3600 s.
func waitBounds(secs int) time.Duration {
	if secs <= 0 {
		secs = 600
	}
	return time.Duration(min(secs, 3600)) * time.Second
}

// tool registers a tool whose handler takes typed input.
func tool[In any](s *Server, name, desc string, h func(context.Context, *sdk.CallToolRequest, In) (*sdk.CallToolResult, any, error)) {
	sdk.AddTool(s.sdk, &sdk.Tool{Name: name, Description: desc}, h)
}
