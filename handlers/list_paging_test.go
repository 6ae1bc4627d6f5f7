package handlers

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"berth/db"
)

// TestKeysetListEndpoints walks every keysetList endpoint page by page (limit 2) and checks that
// it shows exactly the caller's rows, each once, in the documented order, that only the last page
// has no next_cursor, and that a bad limit or cursor is the documented 400.
func TestKeysetListEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ctx := context.Background()
	ids := func(sql string, args ...any) []string {
		t.Helper()
		rows, err := e.pool.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	one := func(sql string, args ...any) string {
		t.Helper()
		got := ids(sql, args...)
		if len(got) != 1 {
			t.Fatalf("%s returned %v", sql, got)
		}
		return got[0]
	}

	// Agents: five in A, one in B that A never sees (its name sorts first).
	for i := range 5 {
		e.agentIn(r.A.ID, fmt.Sprintf("bot-%d", 4-i))
	}
	e.agentIn(r.B.ID, "aaa-other")
	// Members: three more in A (the roles give A a board member and a viewer; B has its own).
	for _, m := range []string{"m3", "m1", "m2"} {
		e.actorWith(m+"@acme.test", false, r.A.ID, "viewer")
	}
	// Companies: the viewer belongs to acme, c0, c1 and c2, not to beta or c3.
	for i := range 4 {
		c := e.company(fmt.Sprintf("Company %d", i), fmt.Sprintf("c%d", i))
		if i < 3 {
			e.member(c.ID, r.Viewer.User.ID, "viewer")
		}
	}
	// Workspaces and runs: five each in A, three of them at the same instant, so the id breaks
	// the tie across a page boundary; one more elsewhere that the list must leave out.
	project := one(`INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PG') RETURNING id::text`, r.A.ID)
	otherProject := one(`INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PG') RETURNING id::text`, r.B.ID)
	at := `timestamptz '2025-01-01 00:00:00Z' - (g % 3) * interval '1 minute'`
	ids(`INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref, created_at)
		SELECT $1, $2, 'isolated', 'copy', 'ws-' || md5(random()::text), `+at+` FROM generate_series(1, 5) g`, r.A.ID, project)
	ids(`INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref) VALUES ($1, $2, 'isolated', 'copy', 'ws-' || md5(random()::text))`,
		r.B.ID, otherProject)
	task := one(`INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 1, 'PG-1', 'T') RETURNING id::text`, r.A.ID, project)
	sibling := one(`INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 2, 'PG-2', 'T') RETURNING id::text`, r.A.ID, project)
	ids(`INSERT INTO runs (company_id, task_id, status, created_at) SELECT $1, $2, 'failed', `+at+` FROM generate_series(1, 5) g`, r.A.ID, task)
	ids(`INSERT INTO runs (company_id, task_id, status) VALUES ($1, $2, 'failed')`, r.A.ID, sibling)

	badID := func(c any) string { return "cursor=" + encodeCursor(c) }
	cases := []struct {
		name, path, field string
		want              []string
		badCursors        []string // beyond the malformed ones every list refuses
	}{
		{name: "agents", path: "/api/companies/" + r.A.ID + "/agents", field: "name",
			want: []string{"bot-0", "bot-1", "bot-2", "bot-3", "bot-4"}},
		{name: "members", path: "/api/companies/" + r.A.ID + "/members", field: "email",
			want: []string{"board@acme.test", "m1@acme.test", "m2@acme.test", "m3@acme.test", "viewer@acme.test"}},
		{name: "companies", path: "/api/companies", field: "slug", want: []string{"acme", "c0", "c1", "c2"}},
		{name: "execution workspaces", path: "/api/companies/" + r.A.ID + "/execution-workspaces", field: "id",
			want:       ids(`SELECT id::text FROM execution_workspaces WHERE company_id = $1 ORDER BY created_at DESC, id DESC`, r.A.ID),
			badCursors: []string{badID(workspaceCursor{CreatedAt: time.Now(), ID: "nope"})}},
		{name: "task runs", path: "/api/tasks/" + task + "/runs", field: "id",
			want:       ids(`SELECT id::text FROM runs WHERE task_id = $1 ORDER BY created_at DESC, id DESC`, task),
			badCursors: []string{badID(db.RunCursor{CreatedAt: time.Now(), ID: "nope"}), badID(db.RunCursor{CreatedAt: time.Now()})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			get := func(query string) (int, map[string]any) {
				t.Helper()
				return e.call(r.Viewer, http.MethodGet, tc.path+"?"+query, nil)
			}
			values := func(body map[string]any) []string {
				var out []string
				for _, it := range body["items"].([]any) {
					out = append(out, it.(map[string]any)[tc.field].(string))
				}
				return out
			}
			if len(tc.want) < 3 {
				t.Fatalf("seeded %v: too few rows to follow a cursor", tc.want)
			}

			// limit=2 from the first page to the last.
			var seen []string
			cursor := ""
			for pages := 1; ; pages++ {
				query := "limit=2"
				if cursor != "" {
					query += "&cursor=" + url.QueryEscape(cursor)
				}
				status, body := get(query)
				if status != http.StatusOK || pages > len(tc.want) {
					t.Fatalf("page %d (%s) = %d %v", pages, query, status, body)
				}
				page := values(body)
				cursor, _ = body["next_cursor"].(string)
				last := pages == (len(tc.want)+1)/2
				if len(page) != min(2, len(tc.want)-len(seen)) || (cursor == "") != last {
					t.Fatalf("page %d = %v next_cursor %q; want %d items and a cursor on every page but the last",
						pages, page, cursor, min(2, len(tc.want)-len(seen)))
				}
				seen = append(seen, page...)
				if cursor == "" {
					break
				}
			}
			if !slices.Equal(seen, tc.want) {
				t.Fatalf("paged %v, want %v", seen, tc.want)
			}

			// The default limit (50) holds them all on one page.
			if status, body := get(""); status != http.StatusOK || !slices.Equal(values(body), tc.want) || body["next_cursor"] != "" {
				t.Fatalf("default page = %d %v", status, body)
			}

			refusals := map[string]string{"limit=0": "bad_limit", "limit=201": "bad_limit", "limit=x": "bad_limit",
				"cursor=!!": "bad_cursor", "cursor=" + encodeCursor("a string"): "bad_cursor"}
			for _, q := range tc.badCursors {
				refusals[q] = "bad_cursor"
			}
			messages := map[string]string{"bad_limit": "limit must be a whole number from 1 to 200.",
				"bad_cursor": "The cursor is not valid; start again without it."}
			for query, code := range refusals {
				status, body := get(query)
				errObj, _ := body["error"].(map[string]any)
				if status != http.StatusBadRequest || errObj["code"] != code || errObj["message"] != messages[code] {
					t.Errorf("GET %s?%s = %d %v, want 400 %s", tc.path, strings.TrimSpace(query), status, body, code)
				}
			}
		})
	}
}
