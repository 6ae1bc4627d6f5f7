package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Resources: a run's log and its receipt by URI, read through the same routes as run_log and
// receipt_get.
const (
	runLogTemplate     = "berth://runs/{run_id}/log"
	runReceiptTemplate = "berth://runs/{run_id}/receipt"
)

// codeRefused is the JSON-RPC error code of a resource the API refused for a reason other than
// not found; data carries the API's error object.
const codeRefused = -32003

func (s *Server) addResources() {
	s.sdk.AddResourceTemplate(&sdk.ResourceTemplate{Name: "run_log", URITemplate: runLogTemplate, MIMEType: "text/plain",
		Description: "A run's kept log (head and tail past the cap)."}, s.readResource)
	s.sdk.AddResourceTemplate(&sdk.ResourceTemplate{Name: "run_receipt", URITemplate: runReceiptTemplate, MIMEType: "application/json",
		Description: "A run's signed receipt, byte for byte as GET /api/runs/{id}/receipt serves it."}, s.readResource)
}

// readResource serves berth://runs/{id}/log and berth://runs/{id}/receipt.
func (s *Server) readResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, "berth://runs/")
	id, kind, _ := strings.Cut(rest, "/")
	if !ok || id == "" || strings.ContainsAny(id, "/?#%") || (kind != "log" && kind != "receipt") {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	c := Call{Method: http.MethodGet, Path: "/api/runs/" + seg(id) + "/" + kind}
	if kind == "log" {
		c.Query = query("download", "1")
	}
	r := s.backend(ctx, who(req.Extra), c)
	if r.Status == http.StatusNotFound {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	if !r.ok() {
		data, _ := json.Marshal(r.apiError())
		e := r.apiError()["error"].(map[string]any)
		msg, _ := e["message"].(string)
		return nil, &jsonrpc.Error{Code: codeRefused, Message: msg, Data: data}
	}
	mime := "application/json"
	if kind == "log" {
		mime = "text/plain"
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: mime,
		Text: strings.ToValidUTF8(string(r.Body), "\uFFFD")}}}, nil
}
