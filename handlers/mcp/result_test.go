package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// wire encodes a result as the SDK's JSON-RPC layer does (no HTML escaping) and decodes it
// back into plain JSON values.
func wire(t *testing.T, r sdk.Result) any {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestFlatten(t *testing.T) {
	t.Parallel()
	text := func(s string) []sdk.Content { return []sdk.Content{&sdk.TextContent{Text: s}} }
	for _, tc := range []struct {
		name string
		res  *sdk.CallToolResult
		flat bool
	}{
		{"text", &sdk.CallToolResult{Content: text("a <b> & \"c\"\n\u2028é")}, true},
		{"two texts", &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "a"}, &sdk.TextContent{Text: "b"}}}, true},
		{"file_read", &sdk.CallToolResult{Content: text(strings.Repeat("0123456789abcde\n", 64)),
			StructuredContent: map[string]any{"path": "a/<b>.txt", "size": 1024, "encoding": "utf8", "truncated": false}}, true},
		{"refusal", toolError(Reply{Status: 403, Body: []byte(`{"error":{"code":"path_escape","message":"Outside <root>."}}`)}), true},
		{"meta", &sdk.CallToolResult{Meta: sdk.Meta{"k": "v"}, Content: text("a")}, true},
		{"empty text", &sdk.CallToolResult{Content: text("")}, true},
		{"no content", &sdk.CallToolResult{}, false},
		{"image", &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: []byte{1, 2}, MIMEType: "image/png"}}}, false},
		{"annotated text", &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "a",
			Annotations: &sdk.Annotations{Priority: 1}}}}, false},
		{"text with meta", &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "a", Meta: sdk.Meta{"k": 1}}}}, false},
		{"request state", &sdk.CallToolResult{Content: text("a"), RequestState: "s"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := flatten(tc.res)
			if _, flat := got.(*flatResult); flat != tc.flat {
				t.Fatalf("flatten = %T, want flat %v", got, tc.flat)
			}
			if !tc.flat && got != sdk.Result(tc.res) {
				t.Fatal("flatten did not return the result itself")
			}
			if w, g := wire(t, tc.res), wire(t, got); !reflect.DeepEqual(g, w) {
				t.Fatalf("flat JSON = %v\nSDK JSON = %v", g, w)
			}
		})
	}
}

// textServer serves one tool, "read", whose result is text and meta, over streamable HTTP, with
// or without flatResults, and a plain JSON handler of the same answer at /rest; it returns a
// connected client session and the base URL.
func textServer(tb testing.TB, text string, meta map[string]any, flat bool) (*sdk.ClientSession, string) {
	tb.Helper()
	srv := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "1"}, nil)
	if flat {
		srv.AddReceivingMiddleware(flatResults)
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "read"}, func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: meta}, nil, nil
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	mux.HandleFunc("/rest", func(w http.ResponseWriter, _ *http.Request) {
		body := map[string]any{"content": text}
		for k, v := range meta {
			body[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	})
	ts := httptest.NewServer(mux)
	tb.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "c", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: ts.URL + "/mcp"}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cs.Close() })
	return cs, ts.URL
}

// TestFlatResultsOverHTTP: the SDK's own client reads a flattened result exactly as the SDK's
// own encoding of it.
func TestFlatResultsOverHTTP(t *testing.T) {
	t.Parallel()
	text := "line <1> & \"2\"\n\ttab \u2028 é " + strings.Repeat("x", 70000)
	meta := map[string]any{"path": "<a>.txt", "size": float64(len(text))}
	var got [2]*sdk.CallToolResult
	for i, flat := range []bool{false, true} {
		cs, _ := textServer(t, text, meta, flat)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "read", Arguments: map[string]any{}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if tc, ok := res.Content[0].(*sdk.TextContent); !ok || tc.Text != text || !reflect.DeepEqual(res.StructuredContent, meta) {
			t.Fatalf("flat %v: result = %+v", flat, res)
		}
		got[i] = res
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Fatalf("SDK encoding read as %+v, flat as %+v", got[0], got[1])
	}
}
