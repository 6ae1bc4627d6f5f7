package main

import "testing"

func TestDefaultDataDir(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  map[string]string
		euid int
		want string
	}{
		{"explicit wins for root", map[string]string{"BERTH_DATA_DIR": "/srv/b", "HOME": "/root"}, 0, "/srv/b"},
		{"explicit wins for a user", map[string]string{"BERTH_DATA_DIR": "/srv/b", "XDG_DATA_HOME": "/x"}, 1000, "/srv/b"},
		{"root uses /var/lib", map[string]string{"HOME": "/root", "XDG_DATA_HOME": "/root/.local/share"}, 0, "/var/lib/berth"},
		{"user XDG", map[string]string{"HOME": "/home/ada", "XDG_DATA_HOME": "/home/ada/data"}, 1000, "/home/ada/data/berth"},
		{"user home fallback", map[string]string{"HOME": "/home/ada"}, 1000, "/home/ada/.local/share/berth"},
		{"no home", map[string]string{}, 1000, "berth-data"},
	}
	for _, c := range cases {
		got := defaultDataDir(func(k string) string { return c.env[k] }, c.euid)
		if got != c.want {
			t.Errorf("%s: defaultDataDir = %q, want %q", c.name, got, c.want)
		}
	}
}
