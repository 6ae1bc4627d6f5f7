package main

import (
	"testing"

	"berth/handlers/preview"
)

// TestReadPreviewOrigins: BERTH_PREVIEW_DOMAIN (with or without "*.") selects one host per
// service; otherwise BERTH_PREVIEW_PORTS (default 18100-18199) on BERTH_ADDR's interface; bad
// values are refused with the variable's name.
func TestReadPreviewOrigins(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env     map[string]string
		addr    string
		want    previewOrigins
		wantErr bool
	}{
		{nil, "127.0.0.1:8080", previewOrigins{Ports: preview.DefaultPorts, Bind: "127.0.0.1"}, false},
		{nil, ":8080", previewOrigins{Ports: preview.DefaultPorts, Bind: "0.0.0.0"}, false},
		{map[string]string{"BERTH_PREVIEW_PORTS": "41000-41099"}, "10.0.0.5:80", previewOrigins{Ports: preview.PortRange{Lo: 41000, Hi: 41099}, Bind: "10.0.0.5"}, false},
		{map[string]string{"BERTH_PREVIEW_DOMAIN": "*.Preview.Example.com"}, "127.0.0.1:8080", previewOrigins{Domain: "preview.example.com", Ports: preview.DefaultPorts, Bind: "127.0.0.1"}, false},
		{map[string]string{"BERTH_PREVIEW_DOMAIN": "preview.example.com."}, "127.0.0.1:8080", previewOrigins{Domain: "preview.example.com", Ports: preview.DefaultPorts, Bind: "127.0.0.1"}, false},
		{map[string]string{"BERTH_PREVIEW_DOMAIN": "https://x.example.com"}, "", previewOrigins{}, true},
		{map[string]string{"BERTH_PREVIEW_PORTS": "9000-8000"}, "", previewOrigins{}, true},
		{map[string]string{"BERTH_PREVIEW_PORTS": "many"}, "", previewOrigins{}, true},
		{map[string]string{"BERTH_PREVIEW_PORTS": "0-10"}, "", previewOrigins{}, true},
	}
	for _, tc := range cases {
		got, err := readPreviewOrigins(func(k string) string { return tc.env[k] }, tc.addr)
		if (err != nil) != tc.wantErr || err == nil && got != tc.want {
			t.Errorf("%v on %q = %+v, %v; want %+v (error %v)", tc.env, tc.addr, got, err, tc.want, tc.wantErr)
		}
	}
	if h := preview.PortURLHost("127.0.0.1"); h != "localhost" {
		t.Errorf("previews of a Berth at 127.0.0.1 use %q, want localhost (a cookie jar of their own)", h)
	}
	if h := preview.PortURLHost("localhost"); h != "127.0.0.1" {
		t.Errorf("previews of a Berth at localhost use %q, want 127.0.0.1", h)
	}
	if h := preview.PortURLHost("berth.example.com"); h != "berth.example.com" {
		t.Errorf("previews of berth.example.com use %q", h)
	}
}
