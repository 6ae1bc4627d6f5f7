package environment

import "testing"

// TestLoopbackPort: a plugin's StartService answer is accepted only as 127.0.0.1:PORT, so a
// plugin can never point Berth's preview proxy at another host, interface or name.
func TestLoopbackPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		port int
		ok   bool
	}{
		{"127.0.0.1:8000", 8000, true},
		{"127.0.0.1:65535", 65535, true},
		{"127.0.0.1:0", 0, false},
		{"127.0.0.1:65536", 0, false},
		{"127.0.0.2:8000", 0, false},
		{"0.0.0.0:8000", 0, false},
		{"[::1]:8000", 0, false},
		{"localhost:8000", 0, false},
		{"10.0.0.1:80", 0, false},
		{"169.254.169.254:80", 0, false},
		{"127.0.0.1", 0, false},
		{"127.0.0.1:http", 0, false},
		{"", 0, false},
	} {
		port, err := loopbackPort(tc.addr)
		if (err == nil) != tc.ok || port != tc.port {
			t.Errorf("loopbackPort(%q) = %d, %v; want %d ok=%v", tc.addr, port, err, tc.port, tc.ok)
		}
	}
}
