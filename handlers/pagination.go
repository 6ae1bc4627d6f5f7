package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
)

// Pagination defaults: lists return at most maxPageLimit items per page.
const (
	defaultPageLimit = 50
	maxPageLimit     = 200
)

// pageParams reads `limit` (1…200, default 50) and the opaque `cursor` from a list request.
func pageParams(r *http.Request) (limit int, cursor string, err error) {
	limit = defaultPageLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, convErr := strconv.Atoi(v)
		if convErr != nil || n < 1 || n > maxPageLimit {
			return 0, "", badRequest("bad_limit", "limit must be a whole number from 1 to 200.")
		}
		limit = n
	}
	return limit, r.URL.Query().Get("cursor"), nil
}

// encodeCursor makes an opaque cursor from the sort key of the last item on a page.
func encodeCursor(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// errBadCursor refuses a cursor the list did not hand out.
var errBadCursor = &httpError{Status: http.StatusBadRequest, Code: "bad_cursor", Message: "The cursor is not valid; start again without it."}

// decodeCursor reads a cursor from encodeCursor into dst; a malformed cursor is a 400.
func decodeCursor(cursor string, dst any) error {
	if cursor == "" {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || json.Unmarshal(b, dst) != nil {
		return errBadCursor
	}
	return nil
}

// listResponse is the shape of every JSON list.
type listResponse[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"next_cursor"`
}

// keysetPage trims a list fetched with limit+1 rows to limit and returns the cursor of the next
// page ("" on the last page), made from the last kept item.
func keysetPage[T any](items []T, limit int, key func(T) any) ([]T, string) {
	if len(items) <= limit {
		return items, ""
	}
	items = items[:limit]
	return items, encodeCursor(key(items[limit-1]))
}

// keysetList is one keyset-paged list: how to read the rows after a position in the list's
// stable order, and the position (the cursor's content) of a row. Its page method is the whole
// paging policy: decode and check the cursor, read one row more than asked for to learn whether a
// next page exists, trim, and make the next cursor from the last row kept.
type keysetList[T, K any] struct {
	// fetch reads at most limit rows after the position after (the zero K on the first page).
	fetch func(ctx context.Context, after K, limit int) ([]T, error)
	// key is the position of a row, encoded as the cursor of the page after it.
	key func(T) K
	// valid, when set, checks every cursor a client sends back; false is a bad_cursor 400.
	valid func(K) bool
}

// page reads the page after cursor ("" for the first): at most limit rows and the cursor of the
// next page ("" on the last). A cursor that does not decode, or that valid refuses, is a 400.
func (l keysetList[T, K]) page(ctx context.Context, cursor string, limit int) ([]T, string, error) {
	var after K
	if err := decodeCursor(cursor, &after); err != nil {
		return nil, "", err
	}
	if cursor != "" && l.valid != nil && !l.valid(after) {
		return nil, "", errBadCursor
	}
	items, err := l.fetch(ctx, after, limit+1)
	if err != nil {
		return nil, "", err
	}
	items, next := keysetPage(items, limit, func(item T) any { return l.key(item) })
	return items, next, nil
}

// serveKeyset answers a JSON list request from l: `limit` and `cursor` from the query string,
// then one page written as {items, next_cursor}, each row mapped by toJSON.
func serveKeyset[T, K, J any](w http.ResponseWriter, r *http.Request, l keysetList[T, K], toJSON func(T) J) error {
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	items, next, err := l.page(r.Context(), cursor, limit)
	if err != nil {
		return err
	}
	writeList(w, items, next, toJSON)
	return nil
}

// writeList writes one page as the JSON list shape (200), each row mapped by toJSON; an empty
// page is "items": [], never null.
func writeList[T, J any](w http.ResponseWriter, items []T, next string, toJSON func(T) J) {
	out := listResponse[J]{Items: make([]J, 0, len(items)), NextCursor: next}
	for _, item := range items {
		out.Items = append(out.Items, toJSON(item))
	}
	writeJSON(w, http.StatusOK, out)
}
