package handlers

import (
	"net/http"
	"strings"
	"testing"
)

// TestRunPageRendersANSIColour runs a command that prints colour, markup and terminal escapes:
// the run page shows the colour as classed spans, escapes the markup and interprets nothing else.
func TestRunPageRendersANSIColour(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`printf '\033[1;31mFAILED\033[0m <b>bold?</b>\n\033]0;pwned-title\007\033]8;;https://evil.example\033\\link\033]8;;\033\\ \033[2Jdone\007\n'`)
	id := re.start(task.ID, nil)
	if run := re.waitRun(id, "the end", ended); run["status"] != "succeeded" {
		t.Fatalf("run = %v", run)
	}
	resp := re.do(re.browser(re.r.Viewer), http.MethodGet, "/runs/"+id, nil, nil)
	page := readBody(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("run page = %d", resp.StatusCode)
	}
	logStart := strings.Index(page, `id="run-log"`)
	if logStart < 0 {
		t.Fatalf("no run log on the page: %s", page)
	}
	log := page[logStart:]
	log = log[:strings.Index(log, "</pre>")]
	for _, want := range []string{`<span class="ansi-fg-1 ansi-bold">FAILED</span>`, `&lt;b&gt;bold?&lt;/b&gt;`, "link", "done\u2407"} {
		if !strings.Contains(log, want) {
			t.Errorf("run log lacks %q: %s", want, log)
		}
	}
	for _, bad := range []string{"\x1b", "pwned-title", "evil.example", "<b>", "style="} {
		if strings.Contains(log, bad) {
			t.Errorf("run log contains %q: %s", bad, log)
		}
	}
	// The API and the download keep the bytes as printed.
	if raw := re.log(id); !strings.Contains(raw, "\x1b[1;31mFAILED") {
		t.Errorf("API log lost the raw escapes: %q", raw)
	}
}
