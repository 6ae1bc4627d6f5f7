package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"berth/db"
	"berth/environment/jail/jailtest"
)

// TestPostmasterKilledMidRun is DESIGN §10 end to end on the embedded default: a real
// `berth serve` owns its cluster and runs a task whose command sleeps; the postmaster is
// SIGKILLed. While it is down (the test holds start.lock, which every start takes, so the
// outage lasts long enough to look at) /api/health says degraded and API calls answer 503
// database_unavailable with Retry-After, never 500, and the command finishes meanwhile. Once
// the lock is released the server's supervisor restarts PostgreSQL by itself within 60 s, the
// API answers 200 again, the run ends with its command's real exit code and last log line, and
// the log carries no flood of repeated errors.
func TestPostmasterKilledMidRun(t *testing.T) {
	t.Parallel()
	dataDir := jailtest.Dir(t)
	addr := freeAddr(t)
	base := "http://" + addr
	srv := berthProc(t, map[string]string{"BERTH_DATA_DIR": dataDir, "BERTH_ADDR": addr, "BERTH_LOG_LEVEL": "info",
		"BERTH_NODE_ID": "outage-node"}, "", "serve")
	out := &syncBuffer{}
	srv.Stdout, srv.Stderr = out, out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = srv.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("server output:\n%s", out.String())
		}
	})
	waitHealthy(t, base, 2*time.Minute)

	pg := filepath.Join(dataDir, "pg")
	w := embeddedWorld(t, fmt.Sprintf("host=%s port=5432 user=berth dbname=berth sslmode=disable", filepath.Join(pg, "run")), dataDir)
	tok := w.memberToken()
	api := func(path string) (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		var body struct {
			Error  struct{ Code string } `json:"error"`
			Status string                `json:"status"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Error.Code + body.Status, resp.Header
	}

	_, runID := w.admit("echo begin; sleep 4; echo last line; exit 3")
	w.waitFor("the command to start", time.Minute, func() bool {
		l, err := db.RunLogOf(context.Background(), w.pool, w.company, runID)
		return err == nil && w.run(runID).Status == db.RunRunning && strings.Contains(string(l.Data), "begin")
	})
	if code, _, _ := api("/api/runs/" + runID); code != http.StatusOK {
		t.Fatalf("GET run before the outage = %d", code)
	}

	// Hold start.lock, then kill the postmaster (alone: its backends notice on their own).
	lock, err := os.OpenFile(filepath.Join(pg, "start.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	pid := postmasterPID(t, filepath.Join(pg, "data"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()

	w.waitFor("health to say degraded", 10*time.Second, func() bool {
		code, status, _ := api("/api/health")
		return code == http.StatusServiceUnavailable && status == "degraded"
	})
	seen := map[string]int{}
	for _, path := range []string{"/api/runs/" + runID, "/api/me", "/api/companies", "/api/runs/" + runID + "/log"} {
		code, errCode, h := api(path)
		seen[fmt.Sprintf("%d %s", code, errCode)]++
		if code != http.StatusServiceUnavailable || errCode != "database_unavailable" || h.Get("Retry-After") == "" {
			t.Fatalf("GET %s during the outage = %d %q (Retry-After %q), want 503 database_unavailable", path, code, errCode, h.Get("Retry-After"))
		}
	}
	// A browser with a session gets the 503 page (its session cannot be loaded).
	req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
	req.Header.Set("Cookie", "berth_session=a-session-token")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("page during the outage = %d %s, want a 503 page", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	// The command ends (exit 3) while the database is still down.
	time.Sleep(time.Until(killedAt.Add(7 * time.Second)))
	if code, _, _ := api("/api/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("health while start.lock is held = %d", code)
	}

	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	w.waitFor("PostgreSQL back and healthy by itself", 60*time.Second, func() bool {
		code, _, _ := api("/api/health")
		return code == http.StatusOK
	})
	t.Logf("healthy %s after the release, %s after the kill", time.Since(released).Round(time.Millisecond),
		time.Since(killedAt).Round(time.Millisecond))
	if newPid := postmasterPID(t, filepath.Join(pg, "data")); newPid == pid || newPid == 0 {
		t.Fatalf("postmaster pid after the restart = %d (killed %d)", newPid, pid)
	}
	w.waitFor("the API to answer again", 30*time.Second, func() bool {
		code, _, _ := api("/api/runs/" + runID)
		return code == http.StatusOK
	})

	var r db.Run
	w.waitFor("the run to end", 2*time.Minute, func() bool {
		r = w.run(runID)
		return !r.Live()
	})
	if r.Status != db.RunFailed || r.ErrorCode != "command_failed" || r.ExitCode == nil || *r.ExitCode != 3 {
		t.Fatalf("run = %s/%s exit %v (%s), want failed/command_failed exit 3", r.Status, r.ErrorCode, r.ExitCode, r.ErrorMessage)
	}
	l, err := db.RunLogOf(context.Background(), w.pool, w.company, runID)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(l.Data)), "\n"); lines[len(lines)-1] != "last line" {
		t.Fatalf("log of the run = %q, want it to end with its last line", l.Data)
	}

	logs := out.String()
	if !strings.Contains(logs, "restarted embedded PostgreSQL") {
		t.Fatal("the server did not log the restart")
	}
	// At most one line per message per 10 s window, plus its summary.
	counts := map[string]int{}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			_, msg, _ := strings.Cut(line, "msg=")
			msg, _, _ = strings.Cut(msg, "\" ")
			counts[msg]++
		}
	}
	limit := 2 + 2*int(time.Since(killedAt)/logRepeatWindow)
	for msg, n := range counts {
		if n > limit {
			t.Errorf("%d lines of %s in %s (limit %d)", n, msg, time.Since(killedAt).Round(time.Second), limit)
		}
	}
	t.Logf("responses during the outage: %v; warning/error lines: %v", seen, counts)
}

// embeddedWorld is a crashWorld on an already running database (the embedded cluster of a
// server under test): a company, a board member, a local environment and a project on a git
// repository.
func embeddedWorld(t *testing.T, conn, dataDir string) *crashWorld {
	t.Helper()
	return crashWorldOn(t, conn, dataDir, "")
}

// memberToken gives the world's board member an API token.
func (w *crashWorld) memberToken() string {
	w.t.Helper()
	tok, hash, err := db.NewToken()
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := db.CreateUserToken(context.Background(), w.pool, w.user, "outage", hash); err != nil {
		w.t.Fatal(err)
	}
	return tok
}
