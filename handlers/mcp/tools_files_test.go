package mcp

import (
	"encoding/json"
	"reflect"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"berth/workspace"
)

// TestFileContentKept: file_read's result from the route's kept value is the result from its
// JSON body, for a whole file and for a range.
func TestFileContentKept(t *testing.T) {
	t.Parallel()
	c := workspace.Content{Path: "a/<b>.txt", Size: 12, Encoding: "utf8", Content: "x <y> & \"z\"\n", Truncated: true}
	for name, v := range map[string]any{
		"whole": c,
		"range": workspace.RangeContent{Content: c, Offset: 3, StartLine: 2, EndLine: 4},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want, _, _ := fileContent(Reply{Status: 200, Body: body})
			got, _, _ := fileContent(Reply{Status: 200, Body: body, Value: v})
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("from the value: %+v %v\nfrom the body: %+v %v", got.Content[0], got.StructuredContent, want.Content[0], want.StructuredContent)
			}
			meta := got.StructuredContent.(map[string]any)
			if got.Content[0].(*sdk.TextContent).Text != c.Content || meta["path"] != c.Path || meta["content"] != nil {
				t.Fatalf("result = %+v %v", got.Content[0], meta)
			}
		})
	}
}
