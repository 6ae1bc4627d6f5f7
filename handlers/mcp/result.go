package mcp

import (
	"bytes"
	"context"
	"encoding/json"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// A tool result goes on the wire in one encoding pass.
//
// The SDK encodes a *CallToolResult through nested MarshalJSON methods (the result's, then each
// content's), and encoding/json re-scans the output of every MarshalJSON at each level it is
// embedded in: the text of a 64 KiB file_read went through encoding/json's scanner three times
// on top of being encoded, the largest part of what MCP cost over the REST file API
// (docs/mcp.md "Figures"). flatResult is the same JSON in plain fields, encoded once.

// flatResult is a tool result of text contents only, as its wire JSON.
type flatResult struct {
	sdk.ResultBase               // _meta
	Content           []flatText `json:"content"`
	StructuredContent any        `json:"structuredContent,omitempty"`
	IsError           bool       `json:"isError,omitempty"`
}

// flatText is a text content as its wire JSON.
type flatText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// flatResults is a receiving middleware that hands the SDK each tool result as a flatResult.
func flatResults(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*sdk.CallToolResult); ok && err == nil && r != nil {
			return flatten(r), nil
		}
		return res, err
	}
}

// flatten returns r as a flatResult when that encodes exactly as the SDK encodes r, and r itself
// otherwise (a content that is not plain text, or any field of the SDK's that flatResult does not
// carry, in this protocol version or a later one). It checks by encoding both without their
// texts, which are the only large part and are encoded alike.
func flatten(r *sdk.CallToolResult) sdk.Result {
	if len(r.Content) == 0 {
		return r
	}
	f := &flatResult{Content: make([]flatText, len(r.Content)), StructuredContent: r.StructuredContent, IsError: r.IsError}
	f.Meta = r.Meta
	hollow := *r
	hollow.Content = make([]sdk.Content, len(r.Content))
	for i, c := range r.Content {
		t, ok := c.(*sdk.TextContent)
		if !ok {
			return r
		}
		hollow.Content[i] = &sdk.TextContent{Meta: t.Meta, Annotations: t.Annotations}
		f.Content[i].Type = "text"
	}
	want, err := json.Marshal(&hollow)
	if err != nil {
		return r
	}
	got, err := json.Marshal(f)
	if err != nil || !bytes.Equal(got, want) {
		return r
	}
	for i, c := range r.Content {
		f.Content[i].Text = c.(*sdk.TextContent).Text
	}
	return f
}
