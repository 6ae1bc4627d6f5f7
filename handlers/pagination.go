package handlers

import (
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

// decodeCursor reads a cursor from encodeCursor into dst; a malformed cursor is a 400.
func decodeCursor(cursor string, dst any) error {
	if cursor == "" {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || json.Unmarshal(b, dst) != nil {
		return badRequest("bad_cursor", "The cursor is not valid; start again without it.")
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
