package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"berth/db"
	bmcp "berth/handlers/mcp"
)

// The MCP endpoint (DESIGN §17, docs/mcp.md): /mcp speaks the Model Context Protocol for agents,
// with a bearer token only (an API token or a run token; a session cookie is refused, so no page
// of another site can drive it). Each MCP session is bound to the principal that opened it (the
// SDK refuses the session id with another token). Every tool is served by handlers/mcp as calls
// of this route table, made in-process as the same principal: the API's authorization, scoping,
// validation, error codes and audit events apply unchanged.

// mcpPrincipalKey is where the token info of an /mcp request carries the principal.
const mcpPrincipalKey = "berth.principal"

var errMCPToken = &httpError{Status: http.StatusUnauthorized, Code: "unauthorized",
	Message: "The MCP endpoint needs Authorization: Bearer with an API token or a run token."}

// mcpEndpoint builds the /mcp handler over routes (the route table, without the middleware that
// already ran for the /mcp request itself).
func (s *Server) mcpEndpoint(routes http.Handler) http.Handler {
	srv := bmcp.New(bmcp.Options{Backend: s.mcpBackend(routes), Version: s.version, Logger: s.log})
	s.mcp = srv
	verify := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p := principalFrom(r.Context()) // identify resolved this very bearer token
		if p == nil || p.Via == "session" {
			return nil, auth.ErrInvalidToken
		}
		id := "user:" + p.User.ID
		if p.Run != nil {
			id = "run:" + p.Run.ID
		}
		return &auth.TokenInfo{UserID: id, Extra: map[string]any{mcpPrincipalKey: p, "ip": clientIP(r)}}, nil
	}
	h := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(srv.Handler())
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		if p := principalFrom(r.Context()); p == nil || p.Via == "session" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
			return errMCPToken
		}
		// A GET stream and a waiting tool call outlive the server's write timeout (as /events).
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(w, r)
		return nil
	})
}

// CloseMCP ends every MCP session and its stream (http.Server.RegisterOnShutdown: Shutdown waits
// for handlers, and a GET stream returns only when its session ends).
func (s *Server) CloseMCP() {
	if s.mcp != nil {
		s.mcp.Close()
	}
}

// mcpBackend serves the MCP server's API calls through routes as the caller's principal.
func (s *Server) mcpBackend(routes http.Handler) bmcp.Backend {
	return func(ctx context.Context, who *auth.TokenInfo, c bmcp.Call) bmcp.Reply {
		var p *principal
		ip := ""
		if who != nil {
			p, _ = who.Extra[mcpPrincipalKey].(*principal)
			ip, _ = who.Extra["ip"].(string)
		}
		if p == nil {
			return bmcp.Reply{Status: http.StatusUnauthorized, Body: []byte(`{"error":{"code":"unauthorized","message":"Sign in or present an API token."}}`)}
		}
		var body io.Reader = http.NoBody
		if c.Body != nil {
			b, err := json.Marshal(c.Body)
			if err != nil {
				return bmcp.Reply{Status: http.StatusBadRequest, Body: []byte(`{"error":{"code":"bad_json","message":"The arguments could not be encoded."}}`)}
			}
			body = bytes.NewReader(b)
		}
		target := c.Path
		if len(c.Query) > 0 {
			target += "?" + c.Query.Encode()
		}
		// What databaseAware gives every request: a database outage or an exhausted pool answers
		// its 503, as over HTTP.
		ctx = db.WatchAcquire(context.WithValue(ctx, proberKey{}, s.prober))
		ctx = context.WithValue(ctx, principalKey, p)
		if ip != "" {
			ctx = context.WithValue(ctx, clientAddrKey{}, ip)
		}
		r, err := http.NewRequestWithContext(ctx, c.Method, target, body)
		if err != nil || !strings.HasPrefix(c.Path, "/api/") {
			return bmcp.Reply{Status: http.StatusBadRequest, Body: []byte(`{"error":{"code":"bad_request","message":"The request could not be formed."}}`)}
		}
		if c.Body != nil {
			r.Header.Set("Content-Type", "application/json")
		}
		for k, v := range c.Header {
			r.Header.Set(k, v)
		}
		r.RemoteAddr = ip + ":0"
		rec := &bufferedResponse{header: http.Header{}}
		routes.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		return bmcp.Reply{Status: rec.status, Header: rec.header, Body: rec.body.Bytes(), Value: rec.value}
	}
}

// bufferedResponse collects an in-process API response for the MCP server.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
	value  any // what writeJSON encoded as the whole body, if it did
}

// keepValue keeps the value writeJSON is about to encode, if it is the body's first.
func (b *bufferedResponse) keepValue(v any) {
	if b.body.Len() == 0 && b.value == nil {
		b.value = v
	} else {
		b.value = nil
	}
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}
