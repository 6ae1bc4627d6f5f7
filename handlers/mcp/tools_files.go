package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"berth/workspace"
)

// The file tools are the file-resource routes (docs/api.md "File resources"): paths relative to
// a root, resolved without following a symlink out, .git, secrets and dependency trees denied,
// regular single-link files only; writes only into an execution workspace (a run token: its
// own), at most 1 MiB each.

type filesListInput struct {
	TaskID string `json:"task_id" jsonschema:"the task whose files to list"`
	Root   string `json:"root,omitempty" jsonschema:"a root name from the listing's roots (default: the task's first root, its newest execution workspace)"`
	Path   string `json:"path,omitempty" jsonschema:"directory relative to the root (default: the root)"`
	Cursor string `json:"cursor,omitempty" jsonschema:"next_cursor of the previous page"`
	Limit  int    `json:"limit,omitempty" jsonschema:"entries per page, 1 to 100"`
}

type fileReadInput struct {
	TaskID    string `json:"task_id" jsonschema:"the task whose file to read"`
	Root      string `json:"root,omitempty" jsonschema:"root name (default: the task's first root)"`
	Path      string `json:"path" jsonschema:"file path relative to the root"`
	Offset    int64  `json:"offset,omitempty" jsonschema:"byte range: first byte"`
	Length    int64  `json:"length,omitempty" jsonschema:"byte range: at most this many bytes"`
	StartLine int    `json:"start_line,omitempty" jsonschema:"line range: first line (1-based)"`
	EndLine   int    `json:"end_line,omitempty" jsonschema:"line range: last line (inclusive)"`
}

type fileWriteInput struct {
	TaskID     string `json:"task_id" jsonschema:"the task whose workspace to write in"`
	Root       string `json:"root,omitempty" jsonschema:"root name (default: the task's first root; must be an execution workspace)"`
	Path       string `json:"path" jsonschema:"file path relative to the root"`
	Content    string `json:"content" jsonschema:"the whole new content"`
	Encoding   string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
	CreateDirs bool   `json:"create_dirs,omitempty" jsonschema:"create missing parent directories"`
}

type fileEditInput struct {
	TaskID               string `json:"task_id" jsonschema:"the task whose workspace to edit in"`
	Root                 string `json:"root,omitempty" jsonschema:"root name (default: the task's first root)"`
	Path                 string `json:"path" jsonschema:"file path relative to the root"`
	OldString            string `json:"old_string" jsonschema:"exact text to replace"`
	NewString            string `json:"new_string" jsonschema:"replacement text"`
	ExpectedReplacements int    `json:"expected_replacements,omitempty" jsonschema:"how often old_string must occur (default 1); any other count changes nothing"`
}

type fileDeleteInput struct {
	TaskID string `json:"task_id" jsonschema:"the task whose workspace to delete in"`
	Root   string `json:"root,omitempty" jsonschema:"root name (default: the task's first root)"`
	Path   string `json:"path" jsonschema:"file path relative to the root (regular files only)"`
}

func filesPath(task, rest string) string {
	return "/api/tasks/" + seg(task) + "/file-resources/" + rest
}

// query builds a query string from the non-empty pairs.
func query(kv ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return q
}

func num[T int | int64](v T) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatInt(int64(v), 10)
}

func (s *Server) addFileTools() {
	tool(s, "files_list", "List a directory of the task's files (GET …/file-resources/list): name, path, type, size, modified_at; 100 per page.",
		func(ctx context.Context, req *sdk.CallToolRequest, in filesListInput) (*sdk.CallToolResult, any, error) {
			q := query("root", in.Root, "path", in.Path, "cursor", in.Cursor, "limit", num(in.Limit))
			return reply(s.call(ctx, req, Call{Method: http.MethodGet, Path: filesPath(in.TaskID, "list"), Query: q}))
		})
	tool(s, "file_read", "Read a file of the task (GET …/file-resources/content): UTF-8 text as is, anything else base64, at most 512 KiB; give offset/length or start_line/end_line for part of it.",
		func(ctx context.Context, req *sdk.CallToolRequest, in fileReadInput) (*sdk.CallToolResult, any, error) {
			q := query("root", in.Root, "path", in.Path, "offset", num(in.Offset), "length", num(in.Length),
				"start_line", num(in.StartLine), "end_line", num(in.EndLine))
			return fileContent(s.call(ctx, req, Call{Method: http.MethodGet, Path: filesPath(in.TaskID, "content"), Query: q}))
		})
	tool(s, "file_write", "Create or replace a file in the task's execution workspace (PUT …/file-resources/content), atomically; at most 1 MiB.",
		func(ctx context.Context, req *sdk.CallToolRequest, in fileWriteInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{"root": in.Root, "path": in.Path, "content": in.Content, "encoding": in.Encoding, "create_dirs": in.CreateDirs}
			return reply(s.call(ctx, req, Call{Method: http.MethodPut, Path: filesPath(in.TaskID, "content"), Body: body}))
		})
	tool(s, "file_edit", "Replace old_string with new_string in a file (POST …/file-resources/edit) when it occurs exactly expected_replacements times (default 1); otherwise nothing changes and the error says how many matches there are.",
		func(ctx context.Context, req *sdk.CallToolRequest, in fileEditInput) (*sdk.CallToolResult, any, error) {
			body := map[string]any{"root": in.Root, "path": in.Path, "old_string": in.OldString, "new_string": in.NewString,
				"expected_replacements": in.ExpectedReplacements}
			return reply(s.call(ctx, req, Call{Method: http.MethodPost, Path: filesPath(in.TaskID, "edit"), Body: body}))
		})
	tool(s, "file_delete", "Delete a regular file in the task's execution workspace (DELETE …/file-resources/content).",
		func(ctx context.Context, req *sdk.CallToolRequest, in fileDeleteInput) (*sdk.CallToolResult, any, error) {
			q := query("root", in.Root, "path", in.Path)
			return reply(s.call(ctx, req, Call{Method: http.MethodDelete, Path: filesPath(in.TaskID, "content"), Query: q}))
		})
}

// fileContent is file_read's result: the file's text (or base64) itself as the text content, so
// a client shows the file and nothing is JSON-escaped twice, and the rest of the API's answer
// (path, size, encoding, truncated, the range) as structured content.
func fileContent(r Reply) (*sdk.CallToolResult, any, error) {
	if !r.ok() {
		return toolError(r), nil, nil
	}
	text, rest, kept := keptContent(r.Value)
	if !kept {
		rest = r.Body
	}
	var meta map[string]any
	if err := json.Unmarshal(rest, &meta); err != nil {
		return textResult(r.Body), nil, nil
	}
	if !kept {
		text, _ = meta["content"].(string)
	}
	delete(meta, "content")
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: meta}, nil, nil
}

// keptContent splits the route's answer, kept as its value (Reply.Value), into the file's text
// and the JSON of the rest, so the text is neither decoded nor copied.
func keptContent(v any) (text string, rest []byte, ok bool) {
	var err error
	switch c := v.(type) {
	case workspace.Content:
		text, c.Content = c.Content, ""
		rest, err = json.Marshal(c)
	case workspace.RangeContent:
		text, c.Content.Content = c.Content.Content, ""
		rest, err = json.Marshal(c)
	default:
		return "", nil, false
	}
	return text, rest, err == nil
}
