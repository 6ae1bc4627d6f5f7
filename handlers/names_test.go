package handlers

import (
	"fmt"
	"net/http"
	"testing"
)

// refusedSamples are one of each kind of character no name may hold.
var refusedSamples = map[string]string{
	"ESC": "\x1b[31m", "BEL": "\a", "NUL": "\x00", "DEL": "\x7f", "C1 CSI": "\u009b", "tab": "\t", "newline": "\n",
	"LRE": "\u202a", "RLO": "\u202e", "LRI": "\u2066", "PDI": "\u2069", "LRM": "\u200e", "RLM": "\u200f",
	"invalid UTF-8": "\xff",
}

func TestTextProblem(t *testing.T) {
	t.Parallel()
	for what, c := range refusedSamples {
		if textProblem("a"+c+"b") == "" {
			t.Errorf("name with %s accepted", what)
		}
		multiLine := what == "tab" || what == "newline"
		if got := descriptionProblem("a" + c + "b"); (got == "") != multiLine {
			t.Errorf("description with %s: problem %q", what, got)
		}
	}
	for _, ok := range []string{"Café déjà vu", "日本語のタスク", "emoji 🚢", "a\u200db (ZWJ)", "שלום", "x-y_z.1"} {
		if p := textProblem(ok); p != "" {
			t.Errorf("%q refused: %s", ok, p)
		}
	}
	if p := descriptionProblem("line one\n\tindented\r\n"); p != "" {
		t.Errorf("multi-line description refused: %s", p)
	}
}

// TestNamesRefuseControlAndBidi creates every named resource through the API with each refused
// character (422 naming the field) and with plain Unicode (created).
func TestNamesRefuseControlAndBidi(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	e := f.e
	project := f.project("NAM", nil)
	pid := project["id"].(string)
	resources := []struct {
		name  string
		actor actor
		path  string
		field string
		body  func(v string) map[string]any
	}{
		{"company", f.Admin, "/api/companies", "name", func(v string) map[string]any {
			return map[string]any{"name": v, "slug": "s" + fmt.Sprint(len(v))}
		}},
		{"agent", f.Board, "/api/companies/" + f.A.ID + "/agents", "name", func(v string) map[string]any { return map[string]any{"name": v} }},
		{"agent description", f.Board, "/api/companies/" + f.A.ID + "/agents", "description", func(v string) map[string]any {
			return map[string]any{"name": "described", "description": v}
		}},
		{"project", f.Board, "/api/companies/" + f.A.ID + "/projects", "name", func(v string) map[string]any {
			return map[string]any{"name": v, "key": "K" + fmt.Sprint(len(v))}
		}},
		{"project description", f.Board, "/api/companies/" + f.A.ID + "/projects", "description", func(v string) map[string]any {
			return map[string]any{"name": "described", "key": "D" + fmt.Sprint(len(v)), "description": v}
		}},
		{"project workspace", f.Board, "/api/projects/" + pid + "/workspaces", "name", func(v string) map[string]any {
			return f.dirWorkspace(v)
		}},
		{"task title", f.Board, "/api/projects/" + pid + "/tasks", "title", func(v string) map[string]any { return map[string]any{"title": v} }},
		{"task description", f.Board, "/api/projects/" + pid + "/tasks", "description", func(v string) map[string]any {
			return map[string]any{"title": "described", "description": v}
		}},
		{"environment", f.Admin, "/api/companies/" + f.A.ID + "/environments", "name", func(v string) map[string]any {
			return map[string]any{"name": v, "driver": "local"}
		}},
	}
	refused := []string{"\x1b[2J", "\a", "\u009b", "\u202e", "\u2066", "\u200f"}
	for _, res := range resources {
		for _, c := range refused {
			v := "bad" + c + "name"
			status, out := e.call(res.actor, http.MethodPost, res.path, res.body(v))
			errObj, _ := out["error"].(map[string]any)
			fields, _ := errObj["fields"].(map[string]any)
			if status != http.StatusUnprocessableEntity || fields[res.field] == nil {
				t.Errorf("%s with %q = %d %v, want 422 naming %s", res.name, c, status, out, res.field)
			}
		}
		v := "Café 日本 ok"
		if res.name == "task description" || res.name == "agent description" || res.name == "project description" {
			v = "Line one\n\tline two ✓"
		}
		if status, out := e.call(res.actor, http.MethodPost, res.path, res.body(v)); status != http.StatusCreated {
			t.Errorf("%s with %q = %d %v, want 201", res.name, v, status, out)
		}
	}
	// Updates go through the same check.
	task := f.e.call
	status, out := task(f.Board, http.MethodPost, "/api/projects/"+pid+"/tasks", map[string]any{"title": "to rename"})
	if status != http.StatusCreated {
		t.Fatalf("create task = %d %v", status, out)
	}
	if status, out := e.call(f.Board, http.MethodPatch, "/api/tasks/"+out["id"].(string), map[string]any{"title": "evil\u202egnp.exe"}); status != http.StatusUnprocessableEntity {
		t.Errorf("rename task with RLO = %d %v, want 422", status, out)
	}
	if status, out := e.call(f.Board, http.MethodPatch, "/api/projects/"+pid, map[string]any{"name": "x\x1b]0;pwned\a"}); status != http.StatusUnprocessableEntity {
		t.Errorf("rename project with OSC = %d %v, want 422", status, out)
	}
}
