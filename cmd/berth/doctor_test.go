package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDoctorOnThisMachine runs the real checks: this machine has everything the tests need, so
// every required check holds and doctor exits zero; --quiet then prints only warnings.
func TestDoctorOnThisMachine(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	if err := os.Chmod(data, 0o700); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"BERTH_DATA_DIR": data, "PATH": os.Getenv("PATH")}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"doctor"}, func(k string) string { return env[k] }, nil, &out, &out); err != nil {
		t.Fatalf("doctor: %v\n%s", err, out.String())
	}
	for _, want := range []string{"ok    bubblewrap", "ok    namespaces", "ok    PostgreSQL", "ok    data dir", data, "free", "cgroup v2", "sshd", "node"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"doctor", "--quiet"}, func(k string) string { return env[k] }, nil, &out, &out); err != nil {
		t.Fatalf("doctor --quiet: %v", err)
	}
	if strings.Contains(out.String(), "ok ") || strings.Contains(out.String(), "FAIL") {
		t.Fatalf("doctor --quiet printed checks that hold:\n%s", out.String())
	}
}

// TestDoctorFindsWhatIsMissing is the negative control: no bubblewrap on the search path and a
// data dir below a regular file fail, doctor exits nonzero naming them, and --quiet prints those
// failures with their fixes and nothing that holds.
func TestDoctorFindsWhatIsMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "bin")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	d := doctor{getenv: func(k string) string { return map[string]string{"PATH": empty}[k] }, dataDir: filepath.Join(file, "data"),
		euid: os.Geteuid(), toolDirs: nil}
	checks := d.run(context.Background())
	level := map[string]checkLevel{}
	for _, c := range checks {
		level[c.Name] = c.Level
	}
	for _, name := range []string{"bubblewrap", "namespaces", "jail tools", "data dir"} {
		if level[name] != levelFail {
			t.Errorf("%s = %v, want a failure: %+v", name, level[name], checks)
		}
	}
	if level["sshd"] != levelWarn || level["node"] != levelWarn {
		t.Errorf("optional tools missing should warn, not fail: %+v", checks)
	}
	var out bytes.Buffer
	err := report(&out, checks, true)
	if err == nil || !strings.Contains(err.Error(), "bubblewrap") || !strings.Contains(err.Error(), "data dir") {
		t.Fatalf("report error = %v", err)
	}
	text := out.String()
	if !strings.Contains(text, "FAIL  bubblewrap") || !strings.Contains(text, "fix: apt-get install bubblewrap") ||
		strings.Contains(text, "ok ") || strings.Contains(text, "PostgreSQL") {
		t.Fatalf("quiet report:\n%s", text)
	}

	// Through the command: a data dir under a regular file exits nonzero.
	out.Reset()
	env := map[string]string{"BERTH_DATA_DIR": filepath.Join(file, "data"), "PATH": os.Getenv("PATH")}
	if err := run(context.Background(), []string{"doctor", "--quiet"}, func(k string) string { return env[k] }, nil, &out, &out); err == nil ||
		!strings.Contains(out.String(), "FAIL  data dir") {
		t.Fatalf("doctor with a bad data dir = %v\n%s", err, out.String())
	}
}

func TestCgroupCheck(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if c := cgroupCheck(root); !strings.Contains(c.Detail, "not mounted") || !strings.Contains(c.Fix, "prlimit") {
		t.Fatalf("no cgroup2 = %+v", c)
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := cgroupCheck(root); !strings.Contains(c.Detail, "controllers: cpu memory pids") || !strings.Contains(c.Detail, "children: memory pids") {
		t.Fatalf("cgroup2 = %+v", c)
	}
}
