package handlers

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// numberCursor is the position in numberList: the last number of a page.
type numberCursor struct {
	N int `json:"n"`
}

// numberList is a keysetList over the numbers 1…n in memory; calls records each fetch's after
// and limit so a test can see what the helper asked for.
func numberList(n int, calls *[]numberCursor, limits *[]int) keysetList[int, numberCursor] {
	return keysetList[int, numberCursor]{
		fetch: func(_ context.Context, after numberCursor, limit int) ([]int, error) {
			*calls, *limits = append(*calls, after), append(*limits, limit)
			var out []int
			for i := after.N + 1; i <= n && len(out) < limit; i++ {
				out = append(out, i)
			}
			return out, nil
		},
		key:   func(i int) numberCursor { return numberCursor{N: i} },
		valid: func(c numberCursor) bool { return c.N > 0 },
	}
}

// httpErrorCode is the code of a typed HTTP error ("" for nil, "untyped" for any other error).
func httpErrorCode(err error) string {
	var he *httpError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &he) && he.Status == http.StatusBadRequest:
		return he.Code
	default:
		return "untyped"
	}
}

func TestKeysetListPage(t *testing.T) {
	t.Parallel()
	raw := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	cases := []struct {
		name      string
		cursor    string
		limit     int
		want      []int
		wantNext  string
		wantCode  string       // the 400's code; "" when the page is served
		wantAfter numberCursor // what fetch was given
	}{
		{name: "first page", limit: 2, want: []int{1, 2}, wantNext: encodeCursor(numberCursor{N: 2})},
		{name: "next page from a cursor", cursor: encodeCursor(numberCursor{N: 2}), limit: 2, want: []int{3, 4},
			wantNext: encodeCursor(numberCursor{N: 4}), wantAfter: numberCursor{N: 2}},
		{name: "last page, shorter than limit", cursor: encodeCursor(numberCursor{N: 4}), limit: 2, want: []int{5},
			wantAfter: numberCursor{N: 4}},
		{name: "last page, exactly limit", cursor: encodeCursor(numberCursor{N: 3}), limit: 2, want: []int{4, 5},
			wantAfter: numberCursor{N: 3}},
		{name: "everything on one page", limit: 5, want: []int{1, 2, 3, 4, 5}},
		{name: "past the end", cursor: encodeCursor(numberCursor{N: 5}), limit: 2, wantAfter: numberCursor{N: 5}},
		{name: "not base64", cursor: "!!", limit: 2, wantCode: "bad_cursor"},
		{name: "not JSON", cursor: raw("nope"), limit: 2, wantCode: "bad_cursor"},
		{name: "JSON of the wrong type", cursor: raw(`{"n":"x"}`), limit: 2, wantCode: "bad_cursor"},
		{name: "a position valid refuses", cursor: encodeCursor(numberCursor{N: 0}), limit: 2, wantCode: "bad_cursor"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls []numberCursor
			var limits []int
			got, next, err := numberList(5, &calls, &limits).page(context.Background(), tc.cursor, tc.limit)
			if code := httpErrorCode(err); code != tc.wantCode {
				t.Fatalf("page(%q, %d) error = %v, want code %q", tc.cursor, tc.limit, err, tc.wantCode)
			}
			if tc.wantCode != "" {
				if len(calls) != 0 {
					t.Fatalf("a refused cursor still fetched %v", calls)
				}
				if err.Error() != "400 bad_cursor: The cursor is not valid; start again without it." {
					t.Fatalf("refusal = %q", err)
				}
				return
			}
			if !slices.Equal(got, tc.want) || next != tc.wantNext {
				t.Fatalf("page(%q, %d) = %v %q, want %v %q", tc.cursor, tc.limit, got, next, tc.want, tc.wantNext)
			}
			if len(calls) != 1 || calls[0] != tc.wantAfter || limits[0] != tc.limit+1 {
				t.Fatalf("fetch calls after=%v limit=%v, want one after %v with limit %d", calls, limits, tc.wantAfter, tc.limit+1)
			}
		})
	}

	// Following next_cursor from the first page visits every row once, in order, and stops.
	l := numberList(7, new([]numberCursor), new([]int))
	var seen []int
	cursor := ""
	for pages := 1; ; pages++ {
		got, next, err := l.page(context.Background(), cursor, 3)
		if err != nil || pages > 3 {
			t.Fatalf("page %d: %v %q %v", pages, got, next, err)
		}
		seen = append(seen, got...)
		if cursor = next; cursor == "" {
			break
		}
	}
	if !slices.Equal(seen, []int{1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("walked %v, want 1…7", seen)
	}

	// A fetch error is returned as it is, not as a 400.
	boom := errors.New("boom")
	failing := keysetList[int, numberCursor]{
		fetch: func(context.Context, numberCursor, int) ([]int, error) { return nil, boom },
		key:   func(i int) numberCursor { return numberCursor{N: i} },
	}
	if _, _, err := failing.page(context.Background(), "", 2); !errors.Is(err, boom) {
		t.Fatalf("fetch error = %v, want boom", err)
	}
}

func TestServeKeyset(t *testing.T) {
	t.Parallel()
	type numberJSON struct {
		N int `json:"number"`
	}
	toJSON := func(i int) numberJSON { return numberJSON{N: i} }
	cases := []struct {
		query     string
		wantLimit int    // the limit fetch was given (the page size + 1)
		wantBody  string // the JSON written on success
		wantCode  string
	}{
		{query: "", wantLimit: 51, wantBody: `{"items":[{"number":1},{"number":2},{"number":3}],"next_cursor":""}`},
		{query: "limit=2", wantLimit: 3, wantBody: `{"items":[{"number":1},{"number":2}],"next_cursor":"` + encodeCursor(numberCursor{N: 2}) + `"}`},
		{query: "limit=1&cursor=" + encodeCursor(numberCursor{N: 2}), wantLimit: 2, wantBody: `{"items":[{"number":3}],"next_cursor":""}`},
		{query: "cursor=" + encodeCursor(numberCursor{N: 3}), wantLimit: 51, wantBody: `{"items":[],"next_cursor":""}`},
		{query: "limit=200", wantLimit: 201, wantBody: `{"items":[{"number":1},{"number":2},{"number":3}],"next_cursor":""}`},
		{query: "limit=0", wantCode: "bad_limit"},
		{query: "limit=201", wantCode: "bad_limit"},
		{query: "limit=-1", wantCode: "bad_limit"},
		{query: "limit=x", wantCode: "bad_limit"},
		{query: "limit=0&cursor=!!", wantCode: "bad_limit"}, // the limit is checked first
		{query: "cursor=!!", wantCode: "bad_cursor"},
	}
	for _, tc := range cases {
		t.Run(tc.query, func(t *testing.T) {
			t.Parallel()
			var calls []numberCursor
			var limits []int
			w := httptest.NewRecorder()
			err := serveKeyset(w, httptest.NewRequest(http.MethodGet, "/list?"+tc.query, nil), numberList(3, &calls, &limits), toJSON)
			if code := httpErrorCode(err); code != tc.wantCode {
				t.Fatalf("error = %v, want code %q", err, tc.wantCode)
			}
			if tc.wantCode == "bad_limit" && err.Error() != "400 bad_limit: limit must be a whole number from 1 to 200." {
				t.Fatalf("refusal = %q", err)
			}
			if tc.wantCode != "" {
				if len(calls) != 0 || w.Body.Len() != 0 {
					t.Fatalf("a refused request fetched %v and wrote %q", calls, w.Body)
				}
				return
			}
			if w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != tc.wantBody {
				t.Fatalf("response = %d %s, want 200 %s", w.Code, w.Body, tc.wantBody)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Fatalf("Content-Type = %q", ct)
			}
			if len(limits) != 1 || limits[0] != tc.wantLimit {
				t.Fatalf("fetch limits = %v, want [%d]", limits, tc.wantLimit)
			}
		})
	}
}
