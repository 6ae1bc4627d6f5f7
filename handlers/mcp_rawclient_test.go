package handlers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// rawMCP is an MCP client without an SDK: JSON-RPC over the streamable HTTP transport as a
// script or a client in another language speaks it, one POST per call, its answer (JSON, or the
// one SSE event that carries it) decoded once with encoding/json, the tool's text once more. It
// measures what Berth's MCP endpoint costs apart from the Go SDK's client (BenchmarkMCPFileRead).
type rawMCP struct {
	url, token, session string
	id                  int
	c                   *http.Client
}

// newRawMCP opens a session at url with token: initialize, then notifications/initialized.
func newRawMCP(tb testing.TB, url, token string) *rawMCP {
	tb.Helper()
	m := &rawMCP{url: url, token: token, c: &http.Client{}}
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := m.rpc("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "berth-raw", "version": "1"}}, &init); err != nil {
		tb.Fatalf("raw MCP initialize: %v", err)
	}
	if m.session == "" || init.ProtocolVersion == "" {
		tb.Fatalf("raw MCP initialize: session %q, version %q", m.session, init.ProtocolVersion)
	}
	if err := m.rpc("notifications/initialized", nil, nil); err != nil {
		tb.Fatalf("raw MCP initialized: %v", err)
	}
	tb.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, m.url, nil)
		m.headers(req)
		if resp, err := m.c.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return m
}

func (m *rawMCP) headers(req *http.Request) {
	req.Header.Set("Authorization", "Bearer "+m.token)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	if m.session != "" {
		req.Header.Set("Mcp-Session-Id", m.session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
}

// rpc sends method with params; out (nil for a notification) receives the result.
func (m *rawMCP) rpc(method string, params, out any) error {
	msg := map[string]any{"jsonrpc": "2.0", "method": method}
	if params != nil {
		msg["params"] = params
	}
	if out != nil {
		m.id++
		msg["id"] = m.id
	}
	body, _ := json.Marshal(msg)
	req, err := http.NewRequest(http.MethodPost, m.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	m.headers(req)
	resp, err := m.c.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, resp.Body) // to its end, so the connection is kept for the next call
		resp.Body.Close()
	}()
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" {
		m.session = s
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("%s: %s", method, resp.Status)
		}
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", method, resp.Status)
	}
	data, err := rpcPayload(resp)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	var env struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if env.Error != nil {
		return fmt.Errorf("%s: %s", method, env.Error.Message)
	}
	if string(env.ID) != strconv.Itoa(m.id) {
		return fmt.Errorf("%s: answer to id %s, asked %d", method, env.ID, m.id)
	}
	return json.Unmarshal(env.Result, out)
}

// rpcPayload is the JSON-RPC answer in resp: its body, or the data of its SSE message event.
func rpcPayload(resp *http.Response) ([]byte, error) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return io.ReadAll(resp.Body)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 256<<10), 16<<20)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data, bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))...)
		case len(line) == 0 && len(data) > 0:
			return data, nil
		}
	}
	if len(data) > 0 {
		return data, nil
	}
	return nil, fmt.Errorf("no message in the event stream: %v", sc.Err())
}

// tool calls name with args and returns its text content and its structured content (for
// file_read: the file's text, and the rest of the route's answer).
func (m *rawMCP) tool(name string, args map[string]any) (string, json.RawMessage, error) {
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Structured json.RawMessage `json:"structuredContent"`
		IsError    bool            `json:"isError"`
	}
	if err := m.rpc("tools/call", map[string]any{"name": name, "arguments": args}, &res); err != nil {
		return "", nil, err
	}
	if res.IsError || len(res.Content) == 0 {
		return "", nil, fmt.Errorf("%s: refused: %+v", name, res.Content)
	}
	return res.Content[0].Text, res.Structured, nil
}
