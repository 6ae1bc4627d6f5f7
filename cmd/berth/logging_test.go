package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"berth/db/dbtest"
	"berth/environment/jail/jailtest"
)

// TestServeJSONLogsAndMetricsToken: with BERTH_LOG_FORMAT=json every stderr line of `berth serve`
// is one JSON object with time, level and msg; and BERTH_METRICS_TOKEN opens /metrics on the
// real server, a wrong token does not.
func TestServeJSONLogsAndMetricsToken(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	const token = "scrape-token-0123456789"
	vars := map[string]string{"DATABASE_URL": dbtest.ConnString(t), "BERTH_ADDR": addr, "BERTH_DATA_DIR": jailtest.Dir(t),
		"BERTH_ADMIN_EMAIL": "root@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password",
		"BERTH_LOG_FORMAT": "json", "BERTH_LOG_LEVEL": "info", "BERTH_METRICS_TOKEN": token}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	var errb syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env(vars), strings.NewReader(""), &out, &errb) }()
	base := "http://" + addr
	waitHealthy(t, base, time.Minute)

	scrape := func(tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := scrape(token); code != http.StatusOK || !strings.Contains(body, `berth_http_request_duration_seconds_count{code="200",method="GET",route="GET /api/health"}`) {
		t.Errorf("GET /metrics with the metrics token = %d:\n%.2000s", code, body)
	}
	if code, _ := scrape(token + "0"); code != http.StatusNotFound {
		t.Errorf("GET /metrics with a wrong token = %d, want 404", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop within a minute of cancellation")
	}

	msgs := map[string]int{}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a log line is not JSON: %q (%v)", line, err)
		}
		if rec["time"] == nil || rec["level"] == nil || rec["msg"] == nil {
			t.Fatalf("a log line lacks time, level or msg: %q", line)
		}
		msg, _ := rec["msg"].(string)
		msgs[msg]++
		if msg == "http request" && (rec["path"] == nil || rec["status"] == nil) {
			t.Errorf("request line without path or status: %q", line)
		}
		if strings.Contains(line, token) {
			t.Errorf("the metrics token is in the log: %q", line)
		}
	}
	if msgs["berth serving"] != 1 || msgs["http request"] == 0 || msgs["berth stopping"] != 1 {
		t.Fatalf("log messages = %v", msgs)
	}
}

// TestLogFormatAndMetricsTokenRefused: a log format Berth does not know and a short metrics
// token stop the command before it opens anything.
func TestLogFormatAndMetricsTokenRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"BERTH_LOG_FORMAT": "xml"}, "BERTH_LOG_FORMAT"},
		{map[string]string{"BERTH_METRICS_TOKEN": "short"}, "BERTH_METRICS_TOKEN"},
	} {
		c.vars["BERTH_DATA_DIR"] = t.TempDir()
		if _, _, err := runCLI(t, c.vars, "", "migrate"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a refusal naming %s", c.vars, err, c.want)
		}
	}
}
