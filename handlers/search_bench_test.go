package handlers

import (
	"net/http"
	"net/url"
	"testing"
)

// BenchmarkPaletteSearch measures the command palette's search (GET /search?q=…, the htmx
// fragment the palette swaps in) as a signed-in board member, over a company of 10,000 tasks:
// a task key (an exact match), a word of the titles (thousands match, the first few are shown)
// and a word nothing matches (every table is read to the end).
func BenchmarkPaletteSearch(b *testing.B) {
	w, counter, _ := benchTaskWorld(b)
	client := w.e.browser(w.r.Board)
	h := http.Header{"Hx-Request": {"true"}, "Hx-Target": {"palette-results"}}
	for _, c := range []struct{ name, q string }{{"key", "PRJ-5000"}, {"title-word", "number 12"}, {"no-match", "zzzz"}} {
		b.Run(c.name, func(b *testing.B) {
			benchTaskGet(b, client, counter, w.e.ts.URL+"/search?q="+url.QueryEscape(c.q), h)
		})
	}
}
