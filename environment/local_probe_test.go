package environment

import (
	"strings"
	"testing"
)

// TestProbeReportsBwrapStderr: when bubblewrap cannot build the jail, the shell check quotes
// bubblewrap's own complaint (cut, on one line, without Berth's directories), not just the exit
// code; the same driver without the broken mask passes (the negative control).
func TestProbeReportsBwrapStderr(t *testing.T) {
	t.Parallel()
	data := workDir(t)
	broken := "/nonexistent-berth-probe-mask-" + randomHex(4) // below the read-only root: bwrap cannot mkdir it
	for _, tc := range []struct {
		masks []string
		ok    bool
	}{{[]string{data, broken}, false}, {[]string{data}, true}} {
		d, err := newLocal(Config{Driver: DriverLocal}, Options{Jail: &testJail, DataDir: data, ProbeDir: data, Masks: tc.masks})
		if err != nil {
			t.Fatal(err)
		}
		c := d.probeShell(t.Context())
		if tc.ok {
			if c.Status != CheckPass {
				t.Fatalf("probe without the broken mask = %+v", c)
			}
			continue
		}
		if c.Status != CheckFail || !strings.Contains(c.Detail, "exit 1") || !strings.Contains(c.Detail, "bwrap: Can't mkdir "+broken) {
			t.Fatalf("shell check = %+v, want bubblewrap's reason", c)
		}
		if strings.Contains(c.Detail, data) || strings.Contains(c.Detail, "\n") || len(c.Detail) > 120+maxFailureOutput {
			t.Fatalf("shell check detail names the data dir, spans lines or is long: %q", c.Detail)
		}
	}
}

func TestFailureOutput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 400) + " end"
	cases := []struct{ out, want string }{
		{"berth-probe\n", ""},
		{"", ""},
		{"bwrap: Can't bind /var/lib/berth/x:\n  No such file\n", ": bwrap: Can't bind …/x: No such file"},
		{"berth-probe\nwarning\n", ": warning"},
	}
	for _, c := range cases {
		if got := failureOutput(c.out, "berth-probe", "/var/lib/berth", "/"); got != c.want {
			t.Errorf("failureOutput(%q) = %q, want %q", c.out, got, c.want)
		}
	}
	got := failureOutput(long, "berth-probe")
	if !strings.HasPrefix(got, ": …") || !strings.HasSuffix(got, " end") || len(got) > maxFailureOutput+len(": …") || !strings.Contains(got, "é") {
		t.Errorf("long output = %q (%d bytes)", got, len(got))
	}
}
