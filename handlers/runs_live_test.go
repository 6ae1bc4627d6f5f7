package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// postRun is POST /api/tasks/{id}/runs as a, with an optional Idempotency-Key, safe to call from
// any goroutine (it reports failures as an error instead of stopping the test).
func (re *runEnv) postRun(a actor, taskID, key string) (int, map[string]any, error) {
	req, err := http.NewRequest(http.MethodPost, re.ts.URL+"/api/tasks/"+taskID+"/runs", nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return resp.StatusCode, nil, err
		}
	}
	return resp.StatusCode, out, nil
}

// TestRunOneLivePerTask: ten concurrent POSTs on one task admit one run (202) and refuse nine
// with 409 run_in_progress naming it; the task page's Run button becomes a link to it and the
// form goes there too; after the run ends the task runs again.
func TestRunOneLivePerTask(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task("echo started; sleep 30")

	const clicks = 10
	type answer struct {
		code int
		body map[string]any
		err  error
	}
	answers := make([]answer, clicks)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clicks {
		wg.Go(func() {
			<-start
			code, body, err := re.postRun(re.r.Board, task.ID, "")
			answers[i] = answer{code, body, err}
		})
	}
	close(start)
	wg.Wait()
	var admitted string
	conflicts := 0
	for _, a := range answers {
		if a.err != nil {
			t.Fatal(a.err)
		}
		switch a.code {
		case http.StatusAccepted:
			if admitted != "" {
				t.Fatalf("two runs admitted: %s and %v", admitted, a.body["id"])
			}
			admitted = a.body["id"].(string)
		case http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("answer %d %v", a.code, a.body)
		}
	}
	if admitted == "" || conflicts != clicks-1 {
		t.Fatalf("admitted %q, %d conflicts; want one run and %d conflicts", admitted, conflicts, clicks-1)
	}
	for _, a := range answers {
		if a.code != http.StatusConflict {
			continue
		}
		e, _ := a.body["error"].(map[string]any)
		run, _ := e["run"].(map[string]any)
		if e["code"] != "run_in_progress" || run["id"] != admitted || run["status"] == nil {
			t.Fatalf("conflict = %v, want run_in_progress naming %s", a.body, admitted)
		}
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE task_id = $1`, task.ID); n != 1 {
		t.Fatalf("%d runs recorded, want 1", n)
	}
	if n := re.count(`SELECT count(*) FROM river_job WHERE kind = 'provision'`); n != 1 {
		t.Fatalf("%d provision jobs, want 1", n)
	}

	// The task page links to the live run instead of offering Run; the form lands on the live run.
	browser := re.browser(re.r.Board)
	resp := re.do(browser, http.MethodGet, "/tasks/"+task.ID, nil, nil)
	page := readBody(t, resp)
	if !strings.Contains(page, `id="live-run" href="/runs/`+admitted+`"`) || strings.Contains(page, `action="/tasks/`+task.ID+`/runs"`) {
		t.Fatalf("task page does not show the live run instead of the Run button:\n%s", page)
	}
	noRedirect := re.browser(re.r.Board)
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp = re.do(noRedirect, http.MethodPost, "/tasks/"+task.ID+"/runs", strings.NewReader(""),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/runs/"+admitted {
		t.Fatalf("Run form while live = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE task_id = $1`, task.ID); n != 1 {
		t.Fatalf("the form queued another run: %d runs", n)
	}

	// Once it has ended, the task runs again and the Run button is back.
	re.waitRun(admitted, "the command start", func(r map[string]any) bool { return r["status"] == "running" })
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/runs/"+admitted+"/cancel", nil); code != http.StatusAccepted {
		t.Fatalf("cancel = %d %v", code, out)
	}
	re.waitRun(admitted, "the cancel", ended)
	resp = re.do(browser, http.MethodGet, "/tasks/"+task.ID, nil, nil)
	if page := readBody(t, resp); strings.Contains(page, `id="live-run"`) || !strings.Contains(page, `action="/tasks/`+task.ID+`/runs"`) {
		t.Fatalf("task page after the end still shows a live run")
	}
	second := re.start(task.ID, nil)
	if second == admitted {
		t.Fatal("the second run has the first one's id")
	}
	re.waitRun(second, "the command start", func(r map[string]any) bool { return r["status"] == "running" })
	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/runs/"+second+"/cancel", nil); code != http.StatusAccepted {
		t.Fatalf("cancel the second run = %d", code)
	}
	re.waitRun(second, "the second cancel", ended)
}

// TestRunIdempotencyKey: the same key answers with the same run while it is live and after it
// ended; another task is 409 idempotency_key_reused; keys are per principal and last 24 hours.
func TestRunIdempotencyKey(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task("echo once")
	other := re.task("echo other")
	board2 := re.actorWith("board2@acme.test", false, re.r.A.ID, "board")

	code, first, err := re.postRun(re.r.Board, task.ID, "deploy-42")
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("first = %d %v %v", code, first, err)
	}
	id := first["id"].(string)
	code, again, err := re.postRun(re.r.Board, task.ID, "deploy-42")
	if err != nil || code != http.StatusAccepted || again["id"] != id {
		t.Fatalf("same key while live = %d %v %v, want 202 with %s", code, again, err, id)
	}
	re.waitRun(id, "the end", ended)
	code, again, err = re.postRun(re.r.Board, task.ID, "deploy-42")
	if err != nil || code != http.StatusAccepted || again["id"] != id || again["status"] != "succeeded" {
		t.Fatalf("same key after the end = %d %v %v, want 202 with the ended run %s", code, again, err, id)
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE task_id = $1`, task.ID); n != 1 {
		t.Fatalf("%d runs for one key, want 1", n)
	}
	// A burst with one key on a fresh task admits one run and answers it to every request.
	burst := re.task("echo burst")
	ids := make([]string, 5)
	errs := make([]error, 5)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			code, out, err := re.postRun(re.r.Board, burst.ID, "burst-1")
			if err == nil && code != http.StatusAccepted {
				err = fmt.Errorf("burst answer %d %v", code, out)
			}
			if err == nil {
				ids[i] = out["id"].(string)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("burst with one key: %v, ids %v", errs[i], ids)
		}
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE task_id = $1`, burst.ID); n != 1 {
		t.Fatalf("a burst with one key recorded %d runs", n)
	}
	re.waitRun(ids[0], "the burst run's end", ended)
	code, reused, err := re.postRun(re.r.Board, other.ID, "deploy-42")
	if e, _ := reused["error"].(map[string]any); err != nil || code != http.StatusConflict || e["code"] != "idempotency_key_reused" {
		t.Fatalf("same key on another task = %d %v %v", code, reused, err)
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE task_id = $1`, other.ID); n != 0 {
		t.Fatalf("a refused key recorded %d runs", n)
	}
	// Another principal's key of the same name is its own.
	code, theirs, err := re.postRun(board2, other.ID, "deploy-42")
	if err != nil || code != http.StatusAccepted || theirs["id"] == id {
		t.Fatalf("another board member's key = %d %v %v", code, theirs, err)
	}
	re.waitRun(theirs["id"].(string), "the end", ended)
	// After 24 hours the key is forgotten: it admits a new run.
	if _, err := re.pool.Exec(context.Background(), `UPDATE run_idempotency_keys SET created_at = now() - interval '25 hours'`); err != nil {
		t.Fatal(err)
	}
	code, fresh, err := re.postRun(re.r.Board, task.ID, "deploy-42")
	if err != nil || code != http.StatusAccepted || fresh["id"] == id {
		t.Fatalf("expired key = %d %v %v, want a new run", code, fresh, err)
	}
	re.waitRun(fresh["id"].(string), "the end", ended)
	for _, bad := range []string{" spaced key", strings.Repeat("k", 256), "caf\u00e9"} {
		req, _ := http.NewRequest(http.MethodPost, re.ts.URL+"/api/tasks/"+task.ID+"/runs", nil)
		req.Header.Set("Authorization", "Bearer "+re.r.Board.Token)
		req.Header.Set("Idempotency-Key", bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("Idempotency-Key %q = %d, want 400", bad, resp.StatusCode)
		}
	}
}

// TestTaskRunsList: GET /api/tasks/{id}/runs lists the task's runs newest first, paged, for
// readers of the company only.
func TestTaskRunsList(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	task := re.task("true") // no workspace: each admission is a blocked (failed) run, never live
	var ids []string
	for range 3 {
		code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil)
		e, _ := out["error"].(map[string]any)
		run, _ := e["run"].(map[string]any)
		if code != http.StatusConflict || run["id"] == nil {
			t.Fatalf("blocked admission = %d %v", code, out)
		}
		ids = append(ids, run["id"].(string))
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		code, out := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/runs?limit=2&cursor="+cursor, nil)
		if code != http.StatusOK || page > 3 {
			t.Fatalf("list = %d %v", code, out)
		}
		for _, it := range out["items"].([]any) {
			got = append(got, it.(map[string]any)["id"].(string))
		}
		if cursor, _ = out["next_cursor"].(string); cursor == "" {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join([]string{ids[2], ids[1], ids[0]}, ",") {
		t.Fatalf("runs %v, want newest first %v", got, ids)
	}
	if code, _ := re.call(re.r.Other, http.MethodGet, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusNotFound {
		t.Fatalf("other company = %d, want 404", code)
	}
	if code, _ := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/runs?cursor=bogus", nil); code != http.StatusBadRequest {
		t.Fatalf("bad cursor = %d, want 400", code)
	}
}

// TestRunLogKeepsHeadAndTail: a real run printing 3 MB keeps its first and last half with one
// marker line, ends with its last line, counts every byte, and serves what was kept through the
// API (tailing by the log's own offsets, and as a download) and on the run page.
func TestRunLogKeepsHeadAndTail(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`head -c 3000000 /dev/zero | tr '\0' a; echo; echo LAST-LINE`)
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	const printed = 3000000 + 1 + len("LAST-LINE\n")
	if run["status"] != "succeeded" || run["log_truncated"] != true || run["log_bytes"] != float64(printed) {
		t.Fatalf("run = %v", run)
	}
	get := func(a actor, path string) (*http.Response, string) {
		t.Helper()
		resp := re.do(re.client(), http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer " + a.Token})
		return resp, readBody(t, resp)
	}
	resp, log := get(re.r.Viewer, "/api/runs/"+id+"/log")
	marker := "a\n… " + strconv.Itoa(printed-(1<<20)) + " bytes omitted …\n"
	if resp.StatusCode != http.StatusOK || len(log) != 1<<20+len(marker)-1 || !strings.HasPrefix(log, strings.Repeat("a", 1<<19)) ||
		strings.Count(log, "bytes omitted") != 1 || !strings.Contains(log, marker) || !strings.HasSuffix(log, "a\nLAST-LINE\n") {
		t.Fatalf("log: %d, %d bytes, ending %q", resp.StatusCode, len(log), log[max(0, len(log)-40):])
	}
	if got := resp.Header.Get("X-Log-Offset"); got != strconv.Itoa(printed) {
		t.Fatalf("X-Log-Offset = %s, want %d (the bytes printed)", got, printed)
	}
	if _, rest := get(re.r.Viewer, "/api/runs/"+id+"/log?offset=3000000"); rest != "\nLAST-LINE\n" {
		t.Fatalf("tail from offset 3000000 = %q", rest)
	}
	if _, rest := get(re.r.Viewer, "/api/runs/"+id+"/log?offset="+strconv.Itoa(printed)); rest != "" {
		t.Fatalf("tail from the end = %q", rest)
	}
	resp, file := get(re.r.Viewer, "/api/runs/"+id+"/log?download=1")
	if file != log || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") {
		t.Fatalf("download: %d bytes, disposition %q", len(file), resp.Header.Get("Content-Disposition"))
	}
	if code, _ := re.call(re.r.Other, http.MethodGet, "/api/runs/"+id+"/log?download=1", nil); code != http.StatusNotFound {
		t.Fatalf("other company's download = %d, want 404", code)
	}
	browser := re.browser(re.r.Viewer)
	resp = re.do(browser, http.MethodGet, "/runs/"+id+"/log", nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || body != log {
		t.Fatalf("page download = %d, %d bytes", resp.StatusCode, len(body))
	}
	resp = re.do(browser, http.MethodGet, "/runs/"+id, nil, nil)
	page := readBody(t, resp)
	if !strings.Contains(page, `id="log-truncated"`) || !strings.Contains(page, `href="/runs/`+id+`/log"`) ||
		!strings.Contains(page, "bytes omitted …\n") || !strings.Contains(page, "LAST-LINE") {
		t.Fatalf("run page does not show the kept head and tail and the download")
	}
}
