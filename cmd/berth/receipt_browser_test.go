package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"berth/db/dbtest"
	"berth/environment/jail/jailtest"
)

// serveDemoWith runs `berth serve --demo` in-process and returns its base URL and the variables
// it runs with (so CLI commands reach the same database, data dir and secret key).
func serveDemoWith(t *testing.T) (string, map[string]string) {
	t.Helper()
	addr := freeAddr(t)
	vars := map[string]string{"DATABASE_URL": dbtest.ConnString(t), "BERTH_ADDR": addr, "BERTH_DATA_DIR": jailtest.Dir(t),
		"BERTH_ADMIN_EMAIL": "admin@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password", "BERTH_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--demo"}, env(vars), strings.NewReader(""), &out, &errb) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("serve did not stop")
		}
	})
	base := "http://" + addr
	waitHealthy(t, base, time.Minute)
	return base, vars
}

// apiGet reads a JSON API path with a bearer token.
func apiGet(t *testing.T, base, token, path string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", path, resp.StatusCode, b)
	}
	return b
}

// TestBrowserAttemptsAndReceiptVerify runs three attempts from the task page of a demo install,
// opens the compare page, selects attempt 2 and sees it win with the others under rescue refs;
// then `berth receipt verify` accepts attempt 2's receipt, refuses it with one byte changed
// (signature failure) and reports the digest mismatch once its branch is rewritten.
func TestBrowserAttemptsAndReceiptVerify(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base, vars := serveDemoWith(t)
	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	company := hrefOf(t, ctx, `main a[href^="/companies/"]`)
	browserStep(t, ctx, "projects", chromedp.Navigate(base+company), chromedp.WaitVisible(chromedp.CSS(`a[href^="/projects/"]`)))
	project := hrefOf(t, ctx, `main a[href^="/projects/"]`)
	browserStep(t, ctx, "new task",
		chromedp.Navigate(base+project+"/tasks"),
		chromedp.WaitVisible(chromedp.CSS(`#new-task`)),
		typeInto(chromedp.CSS(`#new-task-title`), "Three ways"),
		typeInto(chromedp.CSS(`#new-task-command`), `echo "$BERTH_RUN_ID" > "out-$BERTH_RUN_ID.txt"`),
		chromedp.Click(chromedp.CSS(`#new-task button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#plan`)),
	)
	taskPath := evalString(t, ctx, `location.pathname`)
	browserStep(t, ctx, "run attempts",
		chromedp.WaitVisible(chromedp.CSS(`#run-attempts`)),
		chromedp.SetValue(chromedp.CSS(`#attempt-count`), "3"),
		chromedp.Click(chromedp.CSS(`#run-attempts`)),
		chromedp.WaitVisible(chromedp.CSS(`#attempts-body`)),
	)
	if p := evalString(t, ctx, `location.pathname`); p != taskPath+"/attempts" {
		t.Fatalf("after Run N attempts the browser is at %s", p)
	}
	// The page follows the runs live; reloading too keeps the test independent of the event stream.
	deadline := time.Now().Add(3 * time.Minute)
	for evalString(t, ctx, `document.querySelector('#select-2') ? 'yes' : 'no'`) != "yes" {
		if time.Now().After(deadline) {
			screenshot(t, ctx, "attempts-not-sealed")
			t.Fatalf("the attempts were not sealed in time: %s", evalString(t, ctx, `document.querySelector('main').innerText`))
		}
		time.Sleep(time.Second)
		browserStep(t, ctx, "reload", chromedp.Navigate(base+taskPath+"/attempts"), chromedp.WaitVisible(chromedp.CSS(`#attempts-body`)))
	}
	if n := evalString(t, ctx, `String(document.querySelectorAll('.attempt').length)`); n != "3" {
		t.Fatalf("the compare page shows %s attempts", n)
	}
	screenshot(t, ctx, "attempts-compare")
	browserStep(t, ctx, "select", chromedp.Click(chromedp.CSS(`#select-2`)), chromedp.WaitVisible(chromedp.CSS(`#attempt-2 #winner`)))
	// The branches move in the select_attempts job; the page follows it live (attempts events).
	browserStep(t, ctx, "selection carried out", chromedp.WaitVisible(chromedp.CSS(`#attempts-result`)))
	rescue := evalString(t, ctx, `[...document.querySelectorAll('.rescue-ref')].map(e => e.textContent.trim()).join(' ')`)
	if !strings.Contains(rescue, "refs/berth/discarded/") || strings.Count(rescue, "refs/berth/discarded/") != 2 ||
		evalString(t, ctx, `document.querySelector('#group-status').textContent`) != "selected" {
		t.Fatalf("after selection: rescue refs %q, page %s", rescue, evalString(t, ctx, `document.querySelector('main').innerText`))
	}
	if res := evalString(t, ctx, `document.querySelector('#attempts-result').textContent`); !strings.Contains(res, "Attempt 2 was selected") {
		t.Fatalf("the result says %q", res)
	}
	screenshot(t, ctx, "attempts-selected")

	// The receipt of the winner verifies with the instance's key and the branch.
	token, _, err := runCLI(t, vars, "", "token", "add", "--email", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	token = strings.TrimSpace(token)
	var group struct {
		BaseCommit string `json:"base_commit"`
		Items      []struct {
			RunID  string `json:"run_id"`
			Branch string `json:"branch"`
		} `json:"items"`
	}
	if err := json.Unmarshal(apiGet(t, base, token, "/api"+taskPath+"/attempts"), &group); err != nil || len(group.Items) != 3 {
		t.Fatalf("attempts: %v %+v", err, group)
	}
	doc := apiGet(t, base, token, "/api/runs/"+group.Items[1].RunID+"/receipt")
	file := filepath.Join(t.TempDir(), "receipt.json")
	if err := os.WriteFile(file, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, vars, "", "receipt", "verify", file)
	if err != nil || !strings.Contains(out, "signature  ok") || !strings.Contains(out, "workspace  ok") ||
		!strings.Contains(out, "branch     ok") || !strings.Contains(out, "base       ok") {
		t.Fatalf("verify: %v\n%s", err, out)
	}

	// One changed byte: a signature failure, and nothing else is checked.
	tampered := bytes.Replace(doc, []byte(`"exit_code": 0`), []byte(`"exit_code": 1`), 1)
	if bytes.Equal(tampered, doc) {
		t.Fatalf("the receipt has no exit code 0: %s", doc)
	}
	if err := os.WriteFile(file, tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, vars, "", "receipt", "verify", file)
	if err == nil || !strings.Contains(out, "signature  FAILED") || strings.Contains(out, "branch") {
		t.Fatalf("verify of a changed receipt: %v\n%s", err, out)
	}

	// The branch rewritten (reset to the base): the digest mismatch is reported.
	repo := filepath.Join(vars["BERTH_DATA_DIR"], "demo", "repo")
	git := exec.Command("git", "-C", repo, "update-ref", "refs/heads/"+group.Items[1].Branch, group.BaseCommit)
	if b, err := git.CombinedOutput(); err != nil {
		t.Fatalf("rewrite the branch: %v %s", err, b)
	}
	if err := os.WriteFile(file, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, vars, "", "receipt", "verify", file)
	if err == nil || !strings.Contains(out, "signature  ok") || !strings.Contains(out, "branch     MISMATCH") {
		t.Fatalf("verify after the branch was rewritten: %v\n%s", err, out)
	}
}
